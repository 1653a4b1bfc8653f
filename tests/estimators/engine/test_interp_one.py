"""``timing.interp_one``, the stall excess's interpolation without the
arrays ``np.interp`` allocates (so the twin's kernel compiles without
Numba's runtime), must give the float ``np.interp`` gives, in NumPy and
in Numba, or the twin's noisy steps would change their bytes."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from estimators.engine.timing import interp_one


@njit(cache=True)
def _numba_interp(x, xp, fp):
    return np.interp(x, xp, fp)


def _same(a: float, b: float) -> bool:
    return np.float64(a).tobytes() == np.float64(b).tobytes()


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.lists(finite, min_size=2, max_size=40), st.lists(finite, min_size=40, max_size=40), finite,
       st.integers(-1, 40))
def test_interp_one_is_np_interp(xs, ys, x, at):
    xp = np.sort(np.array(xs, dtype=np.float64))
    fp = np.array(ys[:xp.size], dtype=np.float64)
    if 0 <= at < xp.size:
        x = float(xp[at])  # on a point (duplicates included), where the rule returns the point's value
    got = interp_one(x, xp, fp)
    assert _same(got, _numba_interp(x, xp, fp))
    assert _same(got, np.interp(x, xp, fp))


def test_interp_one_on_a_profile_like_grid():
    q = np.linspace(0.0, 1.0, 21)
    v = np.cumsum(np.linspace(0.01, 0.4, 21))
    for x in np.random.default_rng(3).random(2000).tolist() + [0.0, 1.0, 0.5, -0.1, 1.1]:
        assert _same(interp_one(x, q, v), np.interp(x, q, v))
    assert np.isnan(interp_one(np.nan, q, v))
