"""The steps ahead of a steady run, drawn once: what ``run_horizon`` computes
to find when a run ends, kept so the run's own steps need not draw them
again.

Why: the lazy fleet loop asks, after an instance is advanced, when its
steady decode run ends (``kernel.run_horizon``); that took each of the
run's step times and noise draws from a copy of the stream, and the steps
drew them again when they ran: at 24 instances the horizon was a tenth of
a replay. Here the horizon writes each step's start, end and typical time
and the stream's state before and after it (``TwinArrays.ahead``,
``ahead_rng``), and ``kernel._skip_run`` takes a step from there when the
step it is about to run is the one written: the same batch size, the same
computed-token sums, the same start and the same stream state. A step's
times are a function of exactly these (and the instance's fixed time
model), so the taken step is the float the drawn one would have been, and
the stream is left where drawing would have left it (the bytes are
tested: ``tests/harness/twin/loop/test_fleet_loop.py``, ``tests/harness/twin/loop/test_fleet_kernel.py``).
Anything else that moves the stream, the batch or the clock (an arrival,
a prefill, a preemption) makes the next step fail the match, and it is
drawn as before.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from estimators.engine.timing import features_time, noisy_ratio
from harness.twin.loop.parts import M_AH_N, M_AH_NB, M_AH_S1, M_AH_S2, P_NOISE_ON

AHEAD = 128  # steps written at most (a longer run's horizon is its 128th step's end: an early wake, still exact)


@njit(cache=True, inline="always")
def step_time(model, n, s1, s2, j, rng, noise_on):
    """Step ``j`` of a steady run of ``n`` decodes whose computed-token sums
    were ``s1``, ``s2`` before its first step: (typical, duration), the
    noise drawn from ``rng`` (``_skip_run``'s expressions)."""
    c1 = s1 + n * j
    c2 = s2 + 2 * j * s1 + n * j * j
    fn = float(n)
    typical = features_time(model.form, model.coef, fn, 0.0, fn, float(c1), float(c2), 0.0, float(c1), 0.0)
    if noise_on:
        dur = typical * noisy_ratio(model.noise, model.stall_q, model.stall_v, rng)
    else:
        dur = typical * model.mult
    return typical, dur


@njit(cache=True)
def find(tw, n, s1, s2, t):
    """The index of the written step that is a run of ``n`` decodes' step
    with sums ``s1``, ``s2`` before it, starting at ``t`` with the stream
    as it is now; -1 if none."""
    meta = tw.meta
    m = meta[M_AH_N]
    if m <= 0 or meta[M_AH_NB] != n:
        return -1
    b1, b2 = meta[M_AH_S1], meta[M_AH_S2]
    d = s1 - b1
    if d < 0 or d % n != 0:
        return -1
    j = d // n
    if j >= m or s2 != b2 + 2 * j * b1 + n * j * j or not tw.ahead[j, 0] == t:
        return -1
    r, w = tw.rng, tw.ahead_rng
    if r[0] != w[j, 0] or r[1] != w[j, 1] or r[2] != w[j, 2] or r[3] != w[j, 3]:
        return -1
    return j


@njit(cache=True)
def write(tw, model, n, s1, s2, t, steps, gap):
    """Draw the ``steps`` (at most ``AHEAD``) steps of a steady run of ``n``
    decodes from sums ``s1``, ``s2``, the first starting at ``t``, from a
    copy of the stream (the stream is left as it was); returns the last
    one's end."""
    m = min(steps, AHEAD)
    ah, ar, meta = tw.ahead, tw.ahead_rng, tw.meta
    noise_on = tw.params[P_NOISE_ON] > 0.0
    r = tw.rng
    for i in range(4):
        ar[0, i] = r[i]
    t_end = t
    for j in range(m):
        w = ar[j + 1]  # step j draws from a copy of the state before it, in the row that keeps the state after it
        for i in range(4):  # (a row, not an array copy: the twin's kernel allocates nothing, ``harness.twin.loop.kernel``)
            w[i] = ar[j, i]
        typical, dur = step_time(model, n, s1, s2, j, w, noise_on)
        t_end = t + 0.0 + dur
        ah[j, 0] = t + 0.0
        ah[j, 1] = t_end
        ah[j, 2] = typical
        t = t_end + gap
    meta[M_AH_N], meta[M_AH_NB], meta[M_AH_S1], meta[M_AH_S2] = m, n, s1, s2
    return t_end


def new_arrays() -> tuple[np.ndarray, np.ndarray]:
    """An instance's empty ``ahead`` and ``ahead_rng``."""
    return np.zeros((AHEAD, 3), dtype=np.float64), np.zeros((AHEAD + 1, 4), dtype=np.uint64)
