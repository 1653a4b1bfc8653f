"""Advancing a scheduler state by a batch that a real engine (or the twin)
already chose: used to rebuild honest pre-step state from a step log. It
applies decisions, it does not make them, so it is not a second copy of
the scheduling rules (those live in ``kernel``); the moves are the shared
``primitives``.
"""
from __future__ import annotations

from numba import njit

from estimators.engine.kv_blocks import cached_hit_blocks, more_blocks, register_blocks, take_blocks
from estimators.engine.layout import (
    C_BLOCK,
    F_BLOCKS,
    F_COMPUTED,
    F_OUTPUTS,
    F_PROMPT,
    F_STATUS,
    S_FREE_BLOCKS,
    S_NR,
    ST_RUNNING,
    ST_WAITING,
)
from estimators.engine.primitives import cdiv, preempt, wait_remove


@njit(cache=True)
def apply_batch(st, plan, n, n_pre):
    """Apply a recorded step's scheduling: its items ``plan.*[:n]`` in the
    scheduler's order (a waiting request is admitted to the tail of
    ``running``) and its preemptions ``plan.preempted[:n_pre]`` (recompute,
    to the front of ``waiting``, in the recorded order). vLLM preempts while
    walking ``running``, when a request's blocks do not fit, so each
    preemption is applied just before the first item that needs its blocks
    (the rest after the items): with prefix caching the blocks it frees are
    the ones handed out next, and which blocks those are decides later hits.

    With prefix caching an admitted request takes its recorded hit
    (``computed`` before its first chunk) from the cache, and every item
    registers its filled blocks, so the cache's contents follow the
    engine's (``cached_hit_blocks`` would have found the same hit)."""
    req, sc = st.req, st.sc
    b = st.cfg[C_BLOCK]
    p = 0
    for j in range(n):
        s = plan.slot[j]
        done = plan.computed[j] + plan.tokens[j]
        if req[s, F_STATUS] == ST_WAITING:
            hb, ev = cached_hit_blocks(st, s, req[s, F_PROMPT] + req[s, F_OUTPUTS])
            rec = plan.computed[j] // b
            if hb > rec:
                hb, ev = rec, (ev if ev < rec else rec)
            while p < n_pre and cdiv(done, b) - hb + ev > sc[S_FREE_BLOCKS]:
                preempt(st, plan.preempted[p])
                p += 1
            wait_remove(sc, st.waiting, s)
            st.running[sc[S_NR]] = s
            sc[S_NR] += 1
            req[s, F_STATUS] = ST_RUNNING
            take_blocks(st, s, hb, cdiv(done, b))
        else:
            need = cdiv(done, b) - req[s, F_BLOCKS]
            while p < n_pre and need > sc[S_FREE_BLOCKS]:
                preempt(st, plan.preempted[p])
                p += 1
            if need > 0:
                more_blocks(st, s, need)
        req[s, F_COMPUTED] = done
        register_blocks(st, s)
    while p < n_pre:
        preempt(st, plan.preempted[p])
        p += 1
