"""Step time of a scheduled batch, in Numba: the batch-time model's typical
time from the batch's items, and its noise (for the twin's ground truth).

Shared by the engine twin (true durations) and SFS (expected durations), so
both charge a batch exactly the same way. ``TimeModel`` is a profile as the
kernels take it: plain numbers and arrays; a fitted ``BatchTimeProfile``
becomes one above the engine (``estimators.timemodel.kernel_form``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from estimators.engine.layout import F_PROMPT

# batch-time forms (``estimators.timemodel.features.FORMS``) as the kernel knows them
FORM_EQ9, FORM_SIX = 0, 1


class TimeModel(NamedTuple):
    """A batch-time profile as the kernels take it."""

    form: int  # FORM_EQ9 | FORM_SIX
    coef: np.ndarray
    mult: float  # expected / typical
    gap: float  # inter-step gap (s)
    noise: np.ndarray  # [log_mu, log_sigma, p_stall, excess_mean]
    stall_q: np.ndarray
    stall_v: np.ndarray


@njit(cache=True)
def plan_time(model, req, plan, n):
    """Typical duration (seconds) of the batch ``plan.*[:n]``."""
    return batch_typical_time(model.form, model.coef, req, plan.slot, plan.tokens, plan.computed, n)


@njit(cache=True)
def batch_typical_time(form_id, coef, req, out_slot, out_tok, out_cb, n):
    """Typical duration of the batch ``out_*[:n]`` (seconds)."""
    tokens = 0.0
    P = 0.0
    D = 0.0
    sc = 0.0
    sc2 = 0.0
    sp2 = 0.0
    sdc = 0.0
    spa = 0.0
    for j in range(n):
        t = float(out_tok[j])
        c = float(out_cb[j])
        tokens += t
        sc += c
        sc2 += c * c
        if t == 1.0 and out_cb[j] >= req[out_slot[j], F_PROMPT]:
            D += 1.0
            sdc += c
        else:
            P += t
            sp2 += t * t
            spa += t * c + t * (t + 1.0) / 2.0
    return features_time(form_id, coef, tokens, P, D, sc, sc2, sp2, sdc, spa)


@njit(cache=True, inline="always")
def features_time(form_id, coef, tokens, P, D, sc, sc2, sp2, sdc, spa):
    """Typical duration from a batch's features (``batch_typical_time``'s
    sums): tokens, prefill tokens P, decodes D, sum of computed-before c and
    of c^2, of prefill t^2, of decode c, and the prefill attention sum. One
    formula, so the twin's run of identical decode steps
    (``harness.twin.loop.skip``), which keeps these sums itself, charges a step
    with exactly the operations a scheduled batch is charged with."""
    if form_id == FORM_EQ9:
        return coef[0] + coef[1] * tokens + coef[2] * sdc + coef[3] * spa
    return coef[0] + coef[1] * P + coef[2] * D + coef[3] * sc + coef[4] * sp2 + coef[5] * sc2


# --- a small, fast, seedable generator (xoshiro256**) so each instance has
# its own reproducible noise stream inside Numba

@njit(cache=True, inline="always")
def _rotl(x, k):
    return (x << np.uint64(k)) | (x >> np.uint64(64 - k))


@njit(cache=True)
def rng_next(s):
    result = _rotl(s[1] * np.uint64(5), 7) * np.uint64(9)
    t = s[1] << np.uint64(17)
    s[2] ^= s[0]
    s[3] ^= s[1]
    s[1] ^= s[2]
    s[0] ^= s[3]
    s[2] ^= t
    s[3] = _rotl(s[3], 45)
    return result


@njit(cache=True)
def rng_uniform(s):
    return float(rng_next(s) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def rng_normal(s):
    u1 = rng_uniform(s)
    while u1 <= 0.0:
        u1 = rng_uniform(s)
    u2 = rng_uniform(s)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def rng_state(seed: int) -> np.ndarray:
    """Four uint64 words from numpy's SeedSequence (never all zero)."""
    words = np.random.SeedSequence(seed).generate_state(4, dtype=np.uint64)
    if not words.any():
        words[0] = 1
    return words


@njit(cache=True)
def noisy_ratio(noise, stall_q, stall_v, s):
    """actual / typical: lognormal jitter, plus a stall excess with
    probability p. ``noise`` = [log_mu, log_sigma, p_stall, excess_mean]."""
    r = np.exp(noise[0] + noise[1] * rng_normal(s))
    if noise[2] > 0.0 and rng_uniform(s) < noise[2]:
        if stall_q.size >= 2:
            r += interp_one(rng_uniform(s), stall_q, stall_v)
        else:
            r += noise[3]
    return r


_LIKELY_IN_CACHE = 8  # (Numba's LIKELY_IN_CACHE_SIZE)


@njit(cache=True)
def _search(key, arr, length, guess):
    """Numba's ``binary_search_with_guess`` (NumPy's, before 1.15), line for
    line: the index ``j`` with ``arr[j] <= key < arr[j + 1]``, -1 below the
    first point, ``length`` above the last."""
    imin = 0
    imax = length
    if key > arr[length - 1]:
        return length
    elif key < arr[0]:
        return -1
    if length <= 4:
        i = 1
        while i < length and key >= arr[i]:
            i += 1
        return i - 1
    if guess > length - 3:
        guess = length - 3
    if guess < 1:
        guess = 1
    if key < arr[guess]:
        if key < arr[guess - 1]:
            imax = guess - 1
            if guess > _LIKELY_IN_CACHE and key >= arr[guess - _LIKELY_IN_CACHE]:
                imin = guess - _LIKELY_IN_CACHE
        else:
            return guess - 1
    else:
        if key < arr[guess + 1]:
            return guess
        else:
            if key < arr[guess + 2]:
                return guess + 1
            else:
                imin = guess + 2
                if (guess < (length - _LIKELY_IN_CACHE - 1)) and (key < arr[guess + _LIKELY_IN_CACHE]):
                    imax = guess + _LIKELY_IN_CACHE
    while imin < imax:
        imid = imin + ((imax - imin) >> 1)
        if key >= arr[imid]:
            imin = imid + 1
        else:
            imax = imid
    return imin - 1


@njit(cache=True)
def interp_one(x, xp, fp):
    """``np.interp(x, xp, fp)`` for one float ``x`` and at least two points:
    the arithmetic of Numba's ``np.interp`` (a facsimile of NumPy's), in
    the same order, without the arrays it allocates. Why: the twin's
    kernel draws a stall's excess with it, and a kernel that allocates
    cannot be compiled without Numba's runtime (``harness.twin.loop.kernel``:
    every array it is handed would otherwise be reference-counted at every
    inner call)."""
    if np.isnan(x):
        return x
    n = xp.size
    j = _search(x, xp, n, 0)
    if j == -1:
        return fp[0]
    if j == n:
        return fp[n - 1]
    if j == n - 1 or xp[j] == x:
        return fp[j]
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    r = slope * (x - xp[j]) + fp[j]
    if np.isnan(r):  # (NumPy 1.17's: a NaN in one direction, try the other)
        r = slope * (x - xp[j + 1]) + fp[j + 1]
        if np.isnan(r) and fp[j] == fp[j + 1]:
            r = fp[j]
    return r
