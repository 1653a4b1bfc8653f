"""Advancing a scheduler state by a batch that a real engine (or the twin)
already chose: used to rebuild honest pre-step state from ``steps`` and
``step_items``. It applies decisions, it does not make them, so it is not a
second copy of the scheduling rules (those live in ``sched_kernel``).
"""
from __future__ import annotations

from numba import njit

from estimators.sched_kernel import cdiv
from estimators.sched_state import (
    C_BLOCK,
    F_BLOCKS,
    F_COMPUTED,
    F_PREEMPTIONS,
    F_STATUS,
    S_CAP,
    S_FREE_BLOCKS,
    S_NR,
    S_WHEAD,
    S_WN,
    ST_RUNNING,
    ST_WAITING,
)


@njit(cache=True)
def _remove_running(sc, running, s):
    w = 0
    for r in range(sc[S_NR]):
        if running[r] != s:
            running[w] = running[r]
            w += 1
    sc[S_NR] = w


@njit(cache=True)
def _remove_waiting(sc, waiting, s):
    cap = sc[S_CAP]
    head = sc[S_WHEAD]
    if waiting[head] == s:  # the usual case: admission from the head
        sc[S_WHEAD] = (head + 1) % cap
        sc[S_WN] -= 1
        return
    w = 0
    for r in range(sc[S_WN]):
        x = waiting[(head + r) % cap]
        if x != s:
            waiting[(head + w) % cap] = x
            w += 1
    sc[S_WN] = w


@njit(cache=True)
def apply_batch(cfg, req, sc, running, waiting, slots, tokens, computed_before, n, preempted, n_pre):
    """Apply a recorded step's scheduling: its preemptions (recompute, to the
    front of ``waiting``, in the recorded order) and then its items, in the
    scheduler's order (a waiting request is admitted to the tail of
    ``running``)."""
    for j in range(n_pre):
        s = preempted[j]
        _remove_running(sc, running, s)
        sc[S_FREE_BLOCKS] += req[s, F_BLOCKS]
        req[s, F_BLOCKS] = 0
        req[s, F_COMPUTED] = 0
        req[s, F_STATUS] = ST_WAITING
        req[s, F_PREEMPTIONS] += 1
        sc[S_WHEAD] = (sc[S_WHEAD] - 1 + sc[S_CAP]) % sc[S_CAP]
        waiting[sc[S_WHEAD]] = s
        sc[S_WN] += 1
    for j in range(n):
        s = slots[j]
        if req[s, F_STATUS] == ST_WAITING:
            _remove_waiting(sc, waiting, s)
            running[sc[S_NR]] = s
            sc[S_NR] += 1
            req[s, F_STATUS] = ST_RUNNING
        req[s, F_COMPUTED] = computed_before[j] + tokens[j]
        need = cdiv(computed_before[j] + tokens[j], cfg[C_BLOCK]) - req[s, F_BLOCKS]
        if need > 0:
            req[s, F_BLOCKS] += need
            sc[S_FREE_BLOCKS] -= need
