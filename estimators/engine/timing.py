"""Step time of a scheduled batch, in Numba: the batch-time model's typical
time from the batch's items, and its noise (for the twin's ground truth).

Shared by the engine twin (true durations) and SFS (expected durations), so
both charge a batch exactly the same way. ``TimeModel`` is a profile as the
kernels take it: plain numbers and arrays; a fitted ``BatchTimeProfile``
becomes one above the engine (``estimators.time_model``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from estimators.engine.layout import F_PROMPT

# batch-time forms (``estimators.batch_features.FORMS``) as the kernel knows them
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
    (``harness.twin.skip``), which keeps these sums itself, charges a step
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
            r += np.interp(rng_uniform(s), stall_q, stall_v)
        else:
            r += noise[3]
    return r

