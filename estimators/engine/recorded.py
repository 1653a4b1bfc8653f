"""Advancing a scheduler state by a batch that a real engine (or the twin)
already chose: used to rebuild honest pre-step state from a step log. It
applies decisions, it does not make them, so it is not a second copy of
the scheduling rules (those live in ``kernel``); the moves are the shared
``primitives``.
"""
from __future__ import annotations

from numba import njit

from estimators.engine.layout import (
    C_BLOCK,
    F_BLOCKS,
    F_COMPUTED,
    F_STATUS,
    S_FREE_BLOCKS,
    S_NR,
    ST_RUNNING,
    ST_WAITING,
)
from estimators.engine.primitives import cdiv, preempt, wait_remove


@njit(cache=True)
def apply_batch(st, plan, n, n_pre):
    """Apply a recorded step's scheduling: its preemptions
    ``plan.preempted[:n_pre]`` (recompute, to the front of ``waiting``, in
    the recorded order) and then its items ``plan.*[:n]``, in the
    scheduler's order (a waiting request is admitted to the tail of
    ``running``)."""
    req, sc = st.req, st.sc
    for j in range(n_pre):
        preempt(st, plan.preempted[j])
    for j in range(n):
        s = plan.slot[j]
        if req[s, F_STATUS] == ST_WAITING:
            wait_remove(sc, st.waiting, s)
            st.running[sc[S_NR]] = s
            sc[S_NR] += 1
            req[s, F_STATUS] = ST_RUNNING
        done = plan.computed[j] + plan.tokens[j]
        req[s, F_COMPUTED] = done
        need = cdiv(done, st.cfg[C_BLOCK]) - req[s, F_BLOCKS]
        if need > 0:
            req[s, F_BLOCKS] += need
            sc[S_FREE_BLOCKS] -= need
