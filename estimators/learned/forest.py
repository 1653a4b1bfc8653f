"""A trained LightGBM booster as plain arrays, predicted by a compiled walk.

Why: see ``estimators.learned.forest_kernel`` (one-row ``predict`` calls
were the learned routers' whole cost). The arrays come from the booster's
own JSON dump, whose thresholds and leaf values are printed with enough
digits to round-trip a double, so the walk gives ``Booster.predict``'s
numbers (``tests/test_learned_forest.py`` checks equality on many rows).
Numerical splits only: the learned features are all numbers.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from estimators.learned.forest_kernel import MISSING_NAN, MISSING_NONE, MISSING_ZERO, forest_predict

_MISSING = {"None": MISSING_NONE, "Zero": MISSING_ZERO, "NaN": MISSING_NAN}


@dataclass(frozen=True)
class Forest:
    """One booster's trees, flattened: node arrays and each tree's root."""

    roots: np.ndarray  # int64 (trees,)
    feature: np.ndarray  # int64 (nodes,): split feature, -1 at a leaf
    threshold: np.ndarray  # float64
    left: np.ndarray  # int64
    right: np.ndarray  # int64
    value: np.ndarray  # float64: leaf output
    default_left: np.ndarray  # uint8
    missing: np.ndarray  # uint8: MISSING_NONE | MISSING_ZERO | MISSING_NAN

    @classmethod
    def from_booster(cls, booster) -> Forest:
        dump = booster.dump_model()
        if dump.get("average_output"):
            raise ValueError("a booster that averages its trees (random forest mode) is not walked here")
        cols: dict[str, list] = {k: [] for k in ("feature", "threshold", "left", "right", "value", "default_left",
                                                 "missing")}
        roots = [_flatten(t["tree_structure"], cols) for t in dump["tree_info"]]
        return cls(np.array(roots, dtype=np.int64), np.array(cols["feature"], dtype=np.int64),
                   np.array(cols["threshold"], dtype=np.float64), np.array(cols["left"], dtype=np.int64),
                   np.array(cols["right"], dtype=np.int64), np.array(cols["value"], dtype=np.float64),
                   np.array(cols["default_left"], dtype=np.uint8), np.array(cols["missing"], dtype=np.uint8))

    def predict(self, x: np.ndarray) -> float:
        return forest_predict(np.asarray(x, dtype=np.float64), self.roots, self.feature, self.threshold, self.left,
                              self.right, self.value, self.default_left, self.missing)


def _flatten(node: dict, cols: dict[str, list]) -> int:
    """Append ``node``'s subtree (iteratively: depth is bounded by the
    booster, not by Python's stack) and return its index."""
    k0 = len(cols["feature"])
    stack = [(node, -1, False)]  # (node, parent index, is the parent's right child)
    while stack:
        nd, parent, is_right = stack.pop()
        k = len(cols["feature"])
        if parent >= 0:
            cols["right" if is_right else "left"][parent] = k
        if "leaf_value" in nd:
            for name, v in (("feature", -1), ("threshold", 0.0), ("left", -1), ("right", -1),
                            ("value", float(nd["leaf_value"])), ("default_left", 0), ("missing", MISSING_NONE)):
                cols[name].append(v)
            continue
        if nd.get("decision_type", "<=") != "<=":
            raise ValueError(f"split {nd.get('decision_type')!r} is not a numerical '<=' split")
        for name, v in (("feature", int(nd["split_feature"])), ("threshold", float(nd["threshold"])),
                        ("left", -1), ("right", -1), ("value", 0.0), ("default_left", int(bool(nd["default_left"]))),
                        ("missing", _MISSING[nd.get("missing_type", "None")])):
            cols[name].append(v)
        stack.append((nd["right_child"], k, True))
        stack.append((nd["left_child"], k, False))
    return k0
