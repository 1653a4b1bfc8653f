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
    C_PREFIX,
    F_BLOCKS,
    F_COMPUTED,
    F_OUTPUTS,
    F_PROMPT,
    F_STATUS,
    PREFIX_ON,
    S_CAP,
    S_FREE_BLOCKS,
    S_NR,
    ST_RUNNING,
    ST_WAITING,
    KernelInputError,
)
from estimators.engine.primitives import cdiv, preempt, wait_remove


@njit(cache=True)
def _distinct(req, slots, n):
    """``slots[:n]`` name no slot twice (statuses are negated as a mark and
    restored: no allocation per step)."""
    ok = True
    for j in range(n):
        s = slots[j]
        if req[s, F_STATUS] < 0:
            ok = False
            break
        req[s, F_STATUS] = -req[s, F_STATUS]
    for j in range(n):
        s = slots[j]
        if req[s, F_STATUS] < 0:
            req[s, F_STATUS] = -req[s, F_STATUS]
    return ok


@njit(cache=True)
def check_batch(st, plan, n, n_pre):
    """Refuse (``KernelInputError``) a recorded batch the state cannot take,
    before anything is moved: a slot out of range (a request that never
    arrived, or that the front end refused, maps to -1), an item whose
    request is not waiting or running (finished already, refused, or not
    yet handed to the scheduler), a slot twice in the batch or in the
    preemptions, a preemption of a request that is not running, negative
    token counts. Each of these would otherwise recycle a slot twice or
    index past an array's end in compiled code. Costs one pass over the
    step's items, next to the walk's own per-step work."""
    req, cap = st.req, st.sc[S_CAP]
    if n < 0 or n > plan.slot.size or n_pre < 0 or n_pre > plan.preempted.size:
        raise KernelInputError("a recorded step has more items than the instance has requests")
    for j in range(n):
        s = plan.slot[j]
        if s < 0 or s >= cap:
            raise KernelInputError("a step schedules a request before it arrived at the instance "
                                   "(or one its front end refused)")
        if req[s, F_STATUS] != ST_WAITING and req[s, F_STATUS] != ST_RUNNING:
            raise KernelInputError("a step schedules a request that is not waiting or running then "
                                   "(finished already, refused, or not yet added to the scheduler)")
        if plan.tokens[j] < 0 or plan.computed[j] < 0:
            raise KernelInputError("a step item has a negative token count")
    for j in range(n_pre):
        s = plan.preempted[j]
        if s < 0 or s >= cap or req[s, F_STATUS] != ST_RUNNING:
            raise KernelInputError("a step preempts a request that is not running then")
    if not _distinct(req, plan.slot, n):
        raise KernelInputError("a step schedules the same request twice")
    if not _distinct(req, plan.preempted, n_pre):
        raise KernelInputError("a step preempts the same request twice")


@njit(cache=True, inline="always")
def _check_blocks(st, new_blocks, total):
    """With prefix caching the block pool hands out real blocks: taking
    more than are free, or more than a block table holds (max_model_len),
    would read past the free queue or write past the table."""
    if st.cfg[C_PREFIX] == PREFIX_ON:
        if new_blocks > st.sc[S_FREE_BLOCKS]:
            raise KernelInputError("a step needs more KV blocks than the instance has free (num_kv_blocks "
                                   "contradicts the steps)")
        if total > st.table.shape[1]:
            raise KernelInputError("a step gives a request more tokens than max_model_len allows "
                                   "(max_model_len contradicts the steps)")


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
    engine's (``cached_hit_blocks`` would have found the same hit).

    A batch the state cannot take is refused first (``check_batch``)."""
    check_batch(st, plan, n, n_pre)
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
            _check_blocks(st, cdiv(done, b) - hb + ev, cdiv(done, b))
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
                _check_blocks(st, need, req[s, F_BLOCKS] + need)
                more_blocks(st, s, need)
        req[s, F_COMPUTED] = done
        register_blocks(st, s)
    while p < n_pre:
        preempt(st, plan.preempted[p])
        p += 1
