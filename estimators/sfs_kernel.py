"""SFS (serving-framework simulation) in Numba.

Given an instance's honest state (after its last completed step, with the
in-flight step's composition), SFS copies it, gives every resident its
*predicted* output length, lets the in-flight step finish (charged its
expected duration minus the time already elapsed, floored at 0), puts the
requests that arrived meanwhile and then the new query at the tail of
``waiting`` at that boundary, and steps the shared scheduler kernel, each
step charged the inter-step gap plus its expected duration, until the step
that computes the query's last prompt token. No future arrivals.

With prefix caching the copy does not include the instance's cache (20,000
blocks on a GPU): the kernel runs in overlay mode, looking hits up in the
live cache read-only plus an overlay of the ids the simulated steps
register (so a queued request hits the prefix an earlier one computes),
and counting blocks without naming them. What it does not follow: blocks
the simulated steps would evict (their later hits still count), and shared
blocks held by residents before the estimate are returned in full when
those finish.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from estimators.block_cache_kernel import ov_clear
from estimators.engine.kernel import complete_step, drop_unservable_head, schedule_step
from estimators.engine.layout import (
    C_PREFIX,
    EV_FIRST,
    F_EVENT,
    F_OUTPUTS,
    F_PROMPT,
    F_RID,
    F_STATUS,
    F_TARGET,
    NF,
    PL_NREJ,
    PREFIX_ON,
    PREFIX_OVERLAY,
    S_CAP,
    S_NFREE_SLOTS,
    S_NR,
    S_WHEAD,
    S_WN,
    ST_WAITING,
)
from estimators.engine.primitives import wait_head, wait_linear, wait_push_back
from estimators.engine.timing import plan_time


@njit(cache=True)
def _predict_target(r2, s, pred_total):
    p = pred_total[r2[s, F_RID]]
    floor = r2[s, F_OUTPUTS] + 1
    r2[s, F_TARGET] = p if p > floor else floor


@njit(cache=True)
def _copy_state(st, st2):
    """``st`` into the scratch ``st2`` (one more row; waiting linearised;
    the extra row is the last free slot)."""
    cap = st.sc[S_CAP]
    st2.cfg[:] = st.cfg
    if st.cfg[C_PREFIX] == PREFIX_ON:
        st2.cfg[C_PREFIX] = PREFIX_OVERLAY  # the live cache is read, never written
        ov_clear(st2.ov)
    for s in range(cap):
        for f in range(NF):
            st2.req[s, f] = st.req[s, f]
    st2.sc[:] = st.sc
    st2.sc[S_CAP] = cap + 1
    for i in range(st.sc[S_NR]):
        st2.running[i] = st.running[i]
    wait_linear(st.sc, st.waiting, st2.waiting)
    st2.sc[S_WHEAD] = 0
    for i in range(st.sc[S_NFREE_SLOTS]):
        st2.free_slots[i] = st.free_slots[i]
    st2.free_slots[st.sc[S_NFREE_SLOTS]] = cap  # the extra row, for the query
    st2.sc[S_NFREE_SLOTS] = st.sc[S_NFREE_SLOTS] + 1


@njit(cache=True)
def sfs_estimate(st, inbox, n_inbox, infl, infl_n, elapsed, first_gap, pred_total, q_rid, q_prompt, model,
                 st2, plan, max_steps):
    """Estimated TTFT (seconds) of a query arriving now, and the number of
    steps simulated. ``infl_n`` = 0 means the instance is idle (``infl`` is
    the in-flight step's plan); ``elapsed`` is now minus the in-flight
    step's start; ``first_gap`` is the time until the first simulated
    schedule() after the in-flight step (a whole gap, or what is left of
    the current one when the engine is between steps). The scratch state
    ``st2`` and plan need room for one more slot than ``st``."""
    _copy_state(st, st2)
    r2, sc2 = st2.req, st2.sc
    # --- residents get predicted output lengths
    for i in range(sc2[S_NR]):
        _predict_target(r2, st2.running[i], pred_total)
    for i in range(sc2[S_WN]):
        _predict_target(r2, st2.waiting[i], pred_total)
    for i in range(n_inbox):
        _predict_target(r2, inbox[i], pred_total)
    # --- the in-flight step: expected duration minus elapsed, then its outputs
    t = 0.0
    if infl_n > 0:
        rem = plan_time(model, r2, infl, infl_n) * model.mult - elapsed
        if rem > 0.0:
            t = rem
        complete_step(st2, infl, infl_n)
    # --- arrivals so far, then the query, join waiting at the boundary
    for i in range(n_inbox):
        s = inbox[i]
        r2[s, F_STATUS] = ST_WAITING
        wait_push_back(sc2, st2.waiting, s)
    sc2[S_NFREE_SLOTS] -= 1
    q = st2.free_slots[sc2[S_NFREE_SLOTS]]
    for f in range(NF):
        r2[q, f] = 0
    r2[q, F_PROMPT] = q_prompt
    r2[q, F_TARGET] = 1 << 40
    r2[q, F_RID] = q_rid
    r2[q, F_STATUS] = ST_WAITING
    wait_push_back(sc2, st2.waiting, q)
    steps = 0
    step_gap = first_gap
    while steps < max_steps:
        n = schedule_step(st2, plan)
        for r in range(plan.counts[PL_NREJ]):
            if plan.rejected[r] == q:
                return np.inf, steps  # refused outright (V0: longer than the budget)
        if n == 0:
            if sc2[S_NR] == 0 and sc2[S_WN] > 0 and wait_head(sc2, st2.waiting) != q:
                drop_unservable_head(st2)  # as the twin does: it could never run
                continue
            return np.inf, steps  # the query can never be admitted here
        t += step_gap + plan_time(model, r2, plan, n) * model.mult
        step_gap = model.gap
        complete_step(st2, plan, n)
        steps += 1
        if r2[q, F_EVENT] & EV_FIRST:
            return t, steps
    return np.inf, steps
