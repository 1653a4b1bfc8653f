"""SFS (serving-framework simulation) in Numba.

Given an instance's honest state (after its last completed step, with the
in-flight step's composition), SFS copies it, gives every resident its
*predicted* output length, lets the in-flight step finish (charged its
expected duration minus the time already elapsed, floored at 0), puts the
requests that arrived meanwhile and then the new query at the tail of
``waiting`` at that boundary, and steps the shared scheduler kernel, each
step charged the inter-step gap plus its expected duration, until the step
that computes the query's last prompt token. No future arrivals.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from estimators.batch_time_kernel import batch_typical_time
from estimators.sched_kernel import complete_step, drop_unservable_head, schedule_step, wait_push_back
from estimators.sched_state import (
    EV_FIRST,
    F_EVENT,
    F_OUTPUTS,
    F_PROMPT,
    F_RID,
    F_STATUS,
    F_TARGET,
    NF,
    S_CAP,
    S_NFREE_SLOTS,
    S_NR,
    S_WHEAD,
    S_WN,
    ST_WAITING,
)


@njit(cache=True)
def _predict_target(r2, s, pred_total):
    p = pred_total[r2[s, F_RID]]
    floor = r2[s, F_OUTPUTS] + 1
    r2[s, F_TARGET] = p if p > floor else floor


@njit(cache=True)
def sfs_estimate(cfg, req, sc, running, waiting, free_slots, inbox, n_inbox, infl_slot, infl_tok, infl_cb, infl_n,
                 elapsed, first_gap, pred_total, q_rid, q_prompt, form_id, coef, mult, gap,
                 r2, sc2, run2, wait2, free2, o_slot, o_tok, o_cb, rej, max_steps):
    """Estimated TTFT (seconds) of a query arriving now, and the number of
    steps simulated. ``infl_n`` = 0 means the instance is idle; ``elapsed``
    is now minus the in-flight step's start; ``first_gap`` is the time until
    the first simulated schedule() after the in-flight step (a whole gap, or
    what is left of the current one when the engine is between steps). Scratch
    arrays (``r2`` .. ``rej``) need room for one more slot than ``req``."""
    cap = sc[S_CAP]
    # --- copy the state (waiting is linearised from its head)
    for s in range(cap):
        for f in range(NF):
            r2[s, f] = req[s, f]
    for f in range(sc.size):
        sc2[f] = sc[f]
    sc2[S_CAP] = cap + 1
    for i in range(sc[S_NR]):
        run2[i] = running[i]
    for i in range(sc[S_WN]):
        wait2[i] = waiting[(sc[S_WHEAD] + i) % cap]
    sc2[S_WHEAD] = 0
    for i in range(sc[S_NFREE_SLOTS]):
        free2[i] = free_slots[i]
    free2[sc[S_NFREE_SLOTS]] = cap  # the extra row, for the query
    sc2[S_NFREE_SLOTS] = sc[S_NFREE_SLOTS] + 1
    # --- residents get predicted output lengths
    for i in range(sc2[S_NR]):
        _predict_target(r2, run2[i], pred_total)
    for i in range(sc2[S_WN]):
        _predict_target(r2, wait2[i], pred_total)
    for i in range(n_inbox):
        _predict_target(r2, inbox[i], pred_total)
    # --- the in-flight step: expected duration minus elapsed, then its outputs
    t = 0.0
    if infl_n > 0:
        rem = batch_typical_time(form_id, coef, r2, infl_slot, infl_tok, infl_cb, infl_n) * mult - elapsed
        if rem > 0.0:
            t = rem
        complete_step(r2, sc2, run2, free2, infl_slot, infl_n)
    # --- arrivals so far, then the query, join waiting at the boundary
    for i in range(n_inbox):
        s = inbox[i]
        r2[s, F_STATUS] = ST_WAITING
        wait_push_back(sc2, wait2, s)
    sc2[S_NFREE_SLOTS] -= 1
    q = free2[sc2[S_NFREE_SLOTS]]
    for f in range(NF):
        r2[q, f] = 0
    r2[q, F_PROMPT] = q_prompt
    r2[q, F_TARGET] = 1 << 40
    r2[q, F_RID] = q_rid
    r2[q, F_STATUS] = ST_WAITING
    wait_push_back(sc2, wait2, q)
    steps = 0
    step_gap = first_gap
    while steps < max_steps:
        rej[0] = 0
        n = schedule_step(cfg, r2, sc2, run2, wait2, o_slot, o_tok, o_cb, rej)
        if rej[0] > 0:
            for r in range(rej[0]):
                if rej[1 + r] == q:
                    return np.inf, steps  # refused outright (V0: longer than the budget)
        if n == 0:
            if sc2[S_NR] == 0 and sc2[S_WN] > 0 and wait2[sc2[S_WHEAD]] != q:
                drop_unservable_head(r2, sc2, wait2)  # as the twin does: it could never run
                continue
            return np.inf, steps  # the query can never be admitted here
        t += step_gap + batch_typical_time(form_id, coef, r2, o_slot, o_tok, o_cb, n) * mult
        step_gap = gap
        complete_step(r2, sc2, run2, free2, o_slot, n)
        steps += 1
        if r2[q, F_EVENT] & EV_FIRST:
            return t, steps
    return np.inf, steps
