"""SFS for an instance with vLLM's async scheduling, in Numba.

The same simulation as ``estimators.sfs.kernel`` (a copy of the honest
state, predicted output lengths, no future arrivals, the query and the
requests already arrived joining at the next boundary), stepped the way
the engine core runs its two-deep batch queue (``harness.twin.loop.kernel``, async mode;
``docs/reference/async-scheduling.md``): a plan is made before the
previous batch's outputs are applied; the device runs the queued batches
back to back, each charged its expected duration; the host applies the
oldest batch's outputs once the device has finished it and the host has
launched its last plan, then spends the inter-step gap before its next
call. The in-flight part is up to two batches: the oldest (on the device
since its start, charged its expected duration, its end floored at now as
in the synchronous SFS) and the queued one (launched, started when the
oldest ends).

Request intake is charged inside the simulation (the first plan's launch
waits for it), not added afterwards as in the synchronous SFS: here the
device may be busy past it, and then it costs nothing.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from estimators.engine.completion import BATCH_QUEUE
from estimators.engine.kernel import complete_step, drop_unservable_head, schedule_step
from estimators.engine.layout import (
    EV_FIRST,
    F_EVENT,
    S_CAP,
    S_NR,
    S_WN,
    KernelInputError,
)
from estimators.engine.primitives import wait_head
from estimators.engine.timing import plan_time
from estimators.engine.view import AH_GAP, AH_LAUNCH, AH_LAUNCH_B, AH_NA, AH_NB, AH_NEXT, AH_Q, AH_START_A, AH_WAIT
from estimators.sfs.kernel import _enqueue_query, _predict_residents, copy_state


@njit(cache=True)
def sfs_estimate_async(st, inbox, n_inbox, pa, pb, ah, now, intake, share, pred_total, q_rid, q_prompt, model,
                       st2, p1, p2, max_steps, typ_out):
    """Estimated TTFT of a query arriving at ``now`` on an async instance,
    with ``estimators.sfs.kernel.sfs_estimate``'s other returns (steps simulated, the
    sum and sum of squares of their typical durations, the oldest in-flight
    batch's typical duration). ``pa`` / ``pb``: the oldest and the queued
    batch's plans (read only); ``ah``: the host's side
    (``estimators.engine.view``'s ``AH_*``); ``intake``: the joining
    requests' intake, charged at the first plan; ``share``: the profile's
    ``host_share`` (the host's input preparation before each launch, the
    rest of a batch's time the device's); ``p1``, ``p2``: scratch
    plans. ``st2`` has room for one more slot than ``st`` and, with prefix
    caching, a copy of the cache (``st2.ov.sc[OV_EXACT]`` set: no overlay)."""
    if not (np.isfinite(now) and np.isfinite(intake)) or n_inbox < 0 or n_inbox > inbox.size \
            or st2.req.shape[0] <= st.sc[S_CAP] or st2.req.shape[1] < st.req.shape[1]:
        raise KernelInputError("SFS was handed a non-finite time or counts past its arrays")
    copy_state(st, st2, False, inbox, n_inbox, pa, 0)
    r2, sc2 = st2.req, st2.sc
    _predict_residents(st2, inbox, n_inbox, pred_total)
    mult, gap = model.mult, model.gap
    nq = int(ah[AH_Q])
    na = int(ah[AH_NA])
    nb = int(ah[AH_NB])
    plans = (pa, pb, p1, p2)
    ia, ib = 0, 1
    s1 = 0.0
    s2 = 0.0
    typ0 = 0.0
    a_end = now
    b_end = now
    dev = 1.0 - share
    if nq > 0:
        if na > 0:
            typ0 = plan_time(model, r2, pa, na) * dev
        a_end = ah[AH_START_A] + typ0 * mult
        if a_end < now:  # ran past its expected end: it ends now at the earliest (as the synchronous SFS)
            a_end = now
    if nq > 1:
        typb = plan_time(model, r2, pb, nb) * dev if nb > 0 else 0.0
        lb = ah[AH_LAUNCH_B]
        b_start = lb if lb > a_end else a_end
        b_end = b_start + typb * mult
    # the state as the host has it: between calls (its next at AH_NEXT), waiting for the oldest batch, or
    # idle (the query's arrival wakes it: a gap, then its call)
    planning = True
    t_next = now + gap
    t_apply = now
    if ah[AH_GAP] != 0.0:
        t_next = ah[AH_NEXT]
    elif ah[AH_WAIT] != 0.0:
        planning = False
        la = ah[AH_LAUNCH]
        t_apply = la if la > a_end else a_end
    # the requests arrived so far, then the query, join waiting (taken in at the next plan)
    q = _enqueue_query(st2, inbox, n_inbox, q_rid, q_prompt, st.req.shape[1])
    pending = intake
    steps = 0
    while steps < max_steps:
        if planning:
            ix = 3 if ia == 2 else 2  # a scratch plan the oldest batch is not in
            x = plans[ix]
            while True:
                n = schedule_step(st2, x)
                if n > 0 or sc2[S_NR] > 0 or sc2[S_WN] == 0:
                    break
                if wait_head(sc2, st2.waiting) == q:
                    return np.inf, steps, s1, s2, typ0  # the query can never be admitted here
                drop_unservable_head(st2)
            if n == 0 and nq == 0:
                return np.inf, steps, s1, s2, typ0
            dur = 0.0
            prep = 0.0
            if n > 0:
                whole = plan_time(model, r2, x, n)
                typ = whole * dev
                prep = whole * share * mult
                s1 += typ
                s2 += typ * typ
                if steps < typ_out.size:
                    typ_out[steps] = typ
                steps += 1
                dur = typ * mult
            launch = t_next + pending + prep
            pending = 0.0
            if nq == 0:
                ia, na = ix, n
                a_end = launch + dur
            else:
                ib, nb = ix, n
                b_start = launch if launch > a_end else a_end
                b_end = b_start + dur
            nq += 1
            if nq < BATCH_QUEUE and (n > 0 or sc2[S_NR] + sc2[S_WN] > 0):
                t_next = launch
            else:
                planning = False
                t_apply = launch if launch > a_end else a_end
        else:
            t = t_apply
            complete_step(st2, plans[ia], na)
            if r2[q, F_EVENT] & EV_FIRST:
                return t - now, steps, s1, s2, typ0
            nq -= 1
            if nq > 0:
                ia, na = ib, nb
                a_end = b_end
            if sc2[S_NR] + sc2[S_WN] > 0:
                planning = True
                t_next = t + gap
            elif nq > 0:
                t_apply = t if t > a_end else a_end
            else:
                return np.inf, steps, s1, s2, typ0
    return np.inf, steps, s1, s2, typ0
