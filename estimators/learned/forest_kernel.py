"""Walk a gradient-boosted forest over plain arrays (Numba, no I/O).

Why: LightGBM's ``Booster.predict`` on one row costs ~100-300 µs of Python
and C set-up, and a router asks three boosters per instance per decision
(6.8 ms per decision at three instances): the prediction, not
the training, was the learned routers' cost. The walk itself is a few
hundred node visits. It follows LightGBM's ``Tree::NumericalDecision``
(a NaN is 0 unless the node's missing type is NaN; a missing value --
zero for type Zero, NaN for type NaN -- goes the default way; else
``x <= threshold`` goes left) and sums the trees' leaves in tree order in
double, as ``Booster.predict`` does (``estimators.learned.forest``).
"""
from __future__ import annotations

import math

from numba import njit

MISSING_NONE, MISSING_ZERO, MISSING_NAN = 0, 1, 2
ZERO_THRESHOLD = 1e-35  # LightGBM's kZeroThreshold


@njit(cache=True)
def forest_predict(x, roots, feature, threshold, left, right, value, default_left, missing):
    """Sum over trees of the leaf ``x`` reaches. Node ``k`` is a leaf when
    ``feature[k] < 0`` (its output ``value[k]``); else its children are
    ``left[k]`` / ``right[k]`` (indices into the same arrays)."""
    total = 0.0
    for t in range(roots.size):
        k = roots[t]
        while feature[k] >= 0:
            v = x[feature[k]]
            m = missing[k]
            if math.isnan(v) and m != MISSING_NAN:
                v = 0.0
            if (m == MISSING_ZERO and -ZERO_THRESHOLD <= v <= ZERO_THRESHOLD) or (m == MISSING_NAN and math.isnan(v)):
                k = left[k] if default_left[k] else right[k]
            elif v <= threshold[k]:
                k = left[k]
            else:
                k = right[k]
        total += value[k]
    return total
