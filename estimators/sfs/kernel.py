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
blocks on a GPU): the kernel runs in overlay mode (``block_overlay.
Overlay``): hits are looked up in the live cache read-only, blocks are
counted rather than named, and the few live blocks the simulated steps
touch or release carry their reference-count change in the overlay, so
the free count and the admission gate come out as on a copy. Two things a
count cannot follow make it fall back to a real copy of the cache (exact,
slower): an allocation that reaches cached blocks (vLLM would evict the
least recently used), and a hit on blocks only the simulation computed.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import overload

from estimators.engine.block_overlay import OV_EXACT, OV_FALLBACK, ov_clear
from estimators.engine.kv_blocks import _core
from estimators.engine.layout import (
    C_PREFIX,
    EV_FIRST,
    F_BLOCKS,
    F_EVENT,
    F_HITB,
    F_OUTPUTS,
    F_PROMPT,
    F_RID,
    F_STATUS,
    F_TARGET,
    PREFIX_OFF,
    PREFIX_ON,
    PREFIX_OVERLAY,
    S_CAP,
    S_NFREE_SLOTS,
    S_NR,
    S_WHEAD,
    S_WN,
    ST_WAITING,
    KernelInputError,
)
from estimators.engine.primitives import wait_linear, wait_push_back
from estimators.engine.step_loop import (
    GAP,
    IDLE,
    M_ASYNC,
    M_BUSY,
    M_N,
    M_N2,
    M_Q,
    M_STEPS,
    P_GAP_WITH_STEP,
    P_HOST_SHARE,
    REFUSED,
    RUNNING,
    SP_TYP,
    SP_TYP2,
    T_A1,
    T_B1,
    T_END,
    T_GAP,
    T_INTAKE,
    T_START,
    loop_step,
    scratch_arrays,
    take_queued,
)
from estimators.engine.timing import plan_time
from estimators.engine.view import H_GAP, H_INFL_N, H_LAUNCH, H_LB, H_N2, H_NEXT, H_Q, H_START, H_WAIT
from estimators.sfs.dist import sfs_p_on_time


@njit(cache=True)
def _predict_target(r2, s, pred_total):
    rid = r2[s, F_RID]
    if rid < 0 or rid >= pred_total.size:  # one compare per resident, beside the copy of its row
        raise KernelInputError("a resident's request id has no predicted length")
    p = pred_total[rid]
    floor = r2[s, F_OUTPUTS] + 1
    r2[s, F_TARGET] = p if p > floor else floor


@njit(cache=True, inline="always")
def _predict_residents(st2, inbox, n_inbox, pred_total):
    """Every resident (running, waiting, arrived since the last step) gets
    its predicted output length: SFS never sees the true one."""
    r2, sc2 = st2.req, st2.sc
    for i in range(sc2[S_NR]):
        _predict_target(r2, st2.running[i], pred_total)
    for i in range(sc2[S_WN]):
        _predict_target(r2, st2.waiting[i], pred_total)
    for i in range(n_inbox):
        _predict_target(r2, inbox[i], pred_total)


@njit(cache=True, inline="always")
def _enqueue_query(st2, inbox, n_inbox, q_rid, q_prompt, nf):
    """The requests arrived so far, then the query (in the scratch state's
    last free slot, its first ``nf`` fields cleared, no target: it runs
    until its first token), join waiting. Returns the query's slot."""
    r2, sc2 = st2.req, st2.sc
    for i in range(n_inbox):
        s = inbox[i]
        r2[s, F_STATUS] = ST_WAITING
        wait_push_back(sc2, st2.waiting, s)
    sc2[S_NFREE_SLOTS] -= 1
    q = st2.free_slots[sc2[S_NFREE_SLOTS]]
    for f in range(nf):
        r2[q, f] = 0
    r2[q, F_PROMPT] = q_prompt
    r2[q, F_TARGET] = 1 << 40
    r2[q, F_RID] = q_rid
    r2[q, F_STATUS] = ST_WAITING
    wait_push_back(sc2, st2.waiting, q)
    return q


@njit(cache=True, inline="always")
def _copy_row(st, st2, s, m):
    for f in range(m):
        st2.req[s, f] = st.req[s, f]


@njit(cache=True)
def copy_state(st, st2, live, inbox, n_inbox, infl, infl_n):
    """``st`` into the scratch ``st2``: one more row (the last free slot,
    for the query), waiting linearised, every request column (async: the
    placeholders too); ``st2`` already points at the instance's cache (or
    holds a copy of it, ``st2.ov.sc[OV_EXACT]`` set). The one copy both
    SFS loops take.

    ``live`` (a ``SchedCore``: caching off): copy only the rows the
    simulation can reach: the running and waiting requests', the arrived
    ones' (``inbox``) and the in-flight step's (``infl[:infl_n]``). The
    simulation reads a row only through those lists and the free list, and
    of the free rows it takes only the extra one, for the query, whose
    fields it clears (``_enqueue_query``); no kernel loops over every row.
    So the scratch rows of free slots (what an earlier estimate left there,
    where the whole copy has the instance's own stale rows) are never read,
    and the estimate is the one the whole copy gives, at a cost in the
    residents, not in the instance's capacity (256-1024 rows on qwen3-h100's
    instances, ~45 residents at 8 q/s per three instances)."""
    cap = st.sc[S_CAP]
    m = st.req.shape[1]
    for i in range(st.cfg.size):  # loops, not slices: compiled without the runtime (``sfs_estimate_borrowed``)
        st2.cfg[i] = st.cfg[i]
    overlay = False if live else _overlay_begin(st, st2)
    for i in range(st.sc.size):
        st2.sc[i] = st.sc[i]
    st2.sc[S_CAP] = cap + 1
    for i in range(st.sc[S_NR]):
        st2.running[i] = st.running[i]
    wait_linear(st.sc, st.waiting, st2.waiting)
    if live:
        for i in range(st.sc[S_NR]):
            _copy_row(st, st2, st.running[i], m)
        for i in range(st.sc[S_WN]):
            _copy_row(st, st2, st2.waiting[i], m)
        for i in range(n_inbox):
            _copy_row(st, st2, inbox[i], m)
        for i in range(infl_n):
            _copy_row(st, st2, infl.slot[i], m)
        # the free list below the extra row is not copied: the simulation pops only the query's slot (the extra
        # row) and pushes the slots it frees, so it never reads an entry below
    else:
        for s in range(cap):
            _copy_row(st, st2, s, m)
            if overlay and st2.req[s, F_BLOCKS] > 0:  # it holds live blocks: it releases them through the live table
                st2.req[s, F_HITB] = -(st2.req[s, F_BLOCKS] + 1)
        for i in range(st.sc[S_NFREE_SLOTS]):
            st2.free_slots[i] = st.free_slots[i]
    st2.sc[S_WHEAD] = 0
    st2.free_slots[st.sc[S_NFREE_SLOTS]] = cap  # the extra row, for the query
    st2.sc[S_NFREE_SLOTS] = st.sc[S_NFREE_SLOTS] + 1


def _overlay_begin(st, st2):
    """With prefix caching and no copy of the cache, switch ``st2`` to
    overlay mode over the live cache; True if so. Always False for a
    ``SchedCore`` scratch state (caching off: no cache fields)."""
    raise NotImplementedError  # compiled only


def _ov_scalars(st2):
    """The overlay's scalars (``st2.sc`` for a ``SchedCore``, never read: its mode is never overlay), in a
    1-tuple (compiled without the runtime, a function may return an array only if it was an argument)."""
    raise NotImplementedError


@njit(cache=True, inline="always")
def _overlay_begin_cached(st, st2):
    overlay = st.cfg[C_PREFIX] == PREFIX_ON and st2.ov.sc[OV_EXACT] == 0
    if overlay:
        st2.cfg[C_PREFIX] = PREFIX_OVERLAY  # the live cache is read, never written
        ov_clear(st2.ov, st2.bc)
    return overlay


@overload(_overlay_begin, inline="always")
def _ov_overlay_begin(st, st2):
    if _core(st2):
        return lambda st, st2: False
    return lambda st, st2: _overlay_begin_cached(st, st2)


@overload(_ov_scalars, inline="always")
def _ov_ov_scalars(st2):
    if _core(st2):
        return lambda st2: (st2.sc,)
    return lambda st2: (st2.ov.sc,)


@njit(cache=True, inline="always")
def _lost(cfg2, ov_sc):
    """The overlay could not follow the simulation: rerun on a copy (takes
    arrays, not ``st2``: an inlined call copies its tuple arguments, a
    reference-count increment and decrement per array)."""
    return cfg2[C_PREFIX] == PREFIX_OVERLAY and ov_sc[OV_FALLBACK] != 0


@njit(cache=True, inline="always")
def _until_first_token(st2, plan, plan2, tw, model, q, max_steps, typ_out):
    """Step the scratch instance (``estimators.engine.step_loop.loop_step``, no
    outcomes, no log) until the step whose outputs give the query (slot
    ``q``) its first token. Returns that step's end (inf: refused, never
    admitted, nothing left to run, or ``max_steps`` simulated), the sum and
    sum of squares of the simulated steps' typical durations (the first
    ``typ_out.size`` written to ``typ_out``), and whether the prefix-cache
    overlay lost track (the result is then void)."""
    meta, times, sp = tw.meta, tw.times, tw.speed
    (ov_sc,) = _ov_scalars(st2)
    cfg2 = st2.cfg
    asy = meta[M_ASYNC] != 0
    s1 = 0.0
    s2 = 0.0
    while True:
        busy = meta[M_BUSY]
        k = meta[M_STEPS]
        if busy == IDLE or ((asy or busy == GAP) and k >= max_steps):
            return np.inf, s1, s2, False
        t = times[T_END]
        queued = meta[M_Q]
        r = loop_step(st2, plan, plan2, tw, model, None, None, q)
        if _lost(cfg2, ov_sc):
            return -1.0, s1, s2, True
        if r == REFUSED:
            return np.inf, s1, s2, False  # refused outright (V0: longer than the budget), or never admissible
        if busy == RUNNING:
            if st2.req[q, F_EVENT] & EV_FIRST:
                return t, s1, s2, False
        elif meta[M_STEPS] > k:
            typ = sp[SP_TYP] if queued == 0 else sp[SP_TYP2]  # (the scratch's host factor is 1)
            s1 += typ
            s2 += typ * typ
            if k < typ_out.size:
                typ_out[k] = typ


@njit(cache=True)
def sfs_estimate(st, inbox, n_inbox, infl, infl_n, elapsed, first_gap, pred_total, q_rid, q_prompt, model,
                 st2, plan, max_steps, typ_out, lp, live_rows=False):
    """Estimated TTFT (seconds) of a query arriving now, the number of
    steps simulated, the sum and sum of squares of the simulated steps'
    typical durations, and the in-flight step's typical duration (0: none)
    (``estimators.sfs.dist`` turns them into the TTFT's distribution, the
    in-flight step's remainder a random term of its own). The
    first ``typ_out.size`` typical durations are written to ``typ_out``
    (size 0 in routing; the brute-force check reads them). ``infl_n`` = 0 means the instance is idle (``infl`` is
    the in-flight step's plan; steps = -1: the prefix-cache overlay could
    not follow, rerun with ``st2`` holding a copy of the cache and table and
    ``st2.ov.sc[OV_EXACT]`` set); ``elapsed`` is now minus the in-flight
    step's start; ``first_gap`` is the time until the first simulated
    schedule() after the in-flight step (a whole gap, or what is left of
    the current one when the engine is between steps). The scratch state
    ``st2`` and plan need room for one more slot than ``st``; ``lp``: the
    loop's scratch (``step_loop.SCRATCH_WORDS``). ``live_rows``
    (``st`` and ``st2`` a ``SchedCore``: caching off): copy only the rows the
    simulation reaches (``copy_state``'s ``live``; the same estimate).

    The steps are the engine loop's (``step_loop.loop_step``), each charged its
    expected time, the clock summed as t + (gap + duration)
    (``P_GAP_WITH_STEP``)."""
    if not (np.isfinite(elapsed) and np.isfinite(first_gap)) or n_inbox < 0 or n_inbox > inbox.size \
            or infl_n < 0 or infl_n > infl.slot.size or st2.sc.size < st.sc.size or st2.req.shape[0] <= st.sc[S_CAP] \
            or st2.req.shape[1] < st.req.shape[1]:
        raise KernelInputError("SFS was handed a non-finite time or counts past its arrays")
    copy_state(st, st2, live_rows and st.cfg[C_PREFIX] == PREFIX_OFF, inbox, n_inbox, infl, infl_n)
    (ov_sc,) = _ov_scalars(st2)
    # --- residents get predicted output lengths
    _predict_residents(st2, inbox, n_inbox, pred_total)
    tw = scratch_arrays(lp)
    meta, times = tw.meta, tw.times
    tw.params[P_GAP_WITH_STEP] = 1.0
    # --- the in-flight step: expected duration minus elapsed, then its outputs
    t = 0.0
    typ0 = 0.0
    if infl_n > 0:
        typ0 = plan_time(model, st2.req, infl, infl_n)
        rem = typ0 * model.mult - elapsed
        if rem > 0.0:
            t = rem
        meta[M_BUSY] = RUNNING
        meta[M_N] = infl_n
        times[T_END] = t
        loop_step(st2, infl, infl, tw, model, None, None, -1)
        if _lost(st2.cfg, ov_sc):
            return -1.0, -1, 0.0, 0.0, typ0
    # --- arrivals so far, then the query, join waiting at the boundary
    q = _enqueue_query(st2, inbox, n_inbox, q_rid, q_prompt, st.req.shape[1])
    meta[M_BUSY] = GAP
    times[T_START] = t
    times[T_GAP] = first_gap
    t, s1, s2, lost = _until_first_token(st2, plan, plan, tw, model, q, max_steps, typ_out)
    return t, -1 if lost else meta[M_STEPS], s1, s2, typ0


@njit(cache=True)
def sfs_estimate_async(st, inbox, n_inbox, pa, pb, ah, now, intake, share, pred_total, q_rid, q_prompt, model,
                       st2, p1, p2, max_steps, typ_out, lp):
    """``sfs_estimate`` on an instance with vLLM's async scheduling: the
    same simulation stepped through the engine loop's async mode (the
    two-deep batch queue, ``step_loop``): a plan is made before the
    previous batch's outputs are applied; the device runs the queued
    batches back to back, each charged its expected duration; the host
    applies the oldest batch's outputs once the device has finished it and
    the host has launched its last plan, then spends the inter-step gap
    before its next call. The in-flight part is up to two batches: the
    oldest (``pa``, on the device since its start, charged its expected
    duration, its end floored at ``now`` as in the synchronous SFS) and the
    queued one (``pb``, launched, started when the oldest ends); ``ah``:
    the host's side (the honest scalars, ``estimators.engine.view``'s ``H_*``). Request
    intake (``intake``) is charged inside the simulation, at the first
    plan's launch (the device may be busy past it, and then it costs
    nothing), not added afterwards as in the synchronous SFS. ``share``:
    the profile's ``host_share``; ``p1``, ``p2``: scratch plans. ``st2``
    has room for one more slot than ``st`` and, with prefix caching, a
    copy of the cache (``st2.ov.sc[OV_EXACT]`` set: no overlay). Returns
    the TTFT from ``now`` and ``sfs_estimate``'s other returns."""
    if not (np.isfinite(now) and np.isfinite(intake)) or n_inbox < 0 or n_inbox > inbox.size \
            or st2.req.shape[0] <= st.sc[S_CAP] or st2.req.shape[1] < st.req.shape[1]:
        raise KernelInputError("SFS was handed a non-finite time or counts past its arrays")
    copy_state(st, st2, False, inbox, n_inbox, pa, 0)
    r2 = st2.req
    _predict_residents(st2, inbox, n_inbox, pred_total)
    tw = scratch_arrays(lp)
    meta, times = tw.meta, tw.times
    meta[M_ASYNC] = 1
    tw.params[P_HOST_SHARE] = share
    mult = model.mult
    nq = int(ah[H_Q])
    na = int(ah[H_INFL_N])
    nb = int(ah[H_N2])
    dev = 1.0 - share
    typ0 = 0.0
    a_end = now
    if nq > 0:
        if na > 0:
            typ0 = plan_time(model, r2, pa, na) * dev
        a_end = ah[H_START] + typ0 * mult
        if a_end < now:  # ran past its expected end: it ends now at the earliest (as the synchronous SFS)
            a_end = now
        take_queued(p1, pa, na)
    if nq > 1:
        typb = plan_time(model, r2, pb, nb) * dev if nb > 0 else 0.0
        lb = ah[H_LB]
        times[T_B1] = (lb if lb > a_end else a_end) + typb * mult
        take_queued(p2, pb, nb)
    times[T_A1] = a_end
    meta[M_Q] = nq
    meta[M_N] = na
    meta[M_N2] = nb
    # the host as it is: between calls (its next at H_NEXT), waiting for the oldest batch, or idle (the
    # query's arrival wakes it: a gap, then its call)
    meta[M_BUSY] = GAP
    times[T_START] = now + model.gap
    if ah[H_GAP] != 0.0:
        times[T_START] = ah[H_NEXT]
    elif ah[H_WAIT] != 0.0:
        meta[M_BUSY] = RUNNING
        la = ah[H_LAUNCH]
        times[T_END] = la if la > a_end else a_end
    # the requests arrived so far, then the query, join waiting (taken in at the next plan, with their intake)
    q = _enqueue_query(st2, inbox, n_inbox, q_rid, q_prompt, st.req.shape[1])
    times[T_INTAKE] = intake
    t, s1, s2, lost = _until_first_token(st2, p1, p2, tw, model, q, max_steps, typ_out)
    return t - now, -1 if lost else meta[M_STEPS], s1, s2, typ0


@njit(cache=True, _nrt=False)
def sfs_estimate_borrowed(st, inbox, n_inbox, infl, infl_n, elapsed, first_gap, pred_total, q_rid, q_prompt, model,
                          st2, plan, max_steps, typ_out, lp):
    """``sfs_estimate`` called from Python with the arrays borrowed.

    Why: compiled without Numba's runtime, this entry hands the kernel the
    caller's arrays without a reference-counted wrapper each (numpy keeps
    them alive for the call, and nothing here outlives it); every inner
    call then skips the atomic increment and decrement of each array it
    takes. A state with the prefix cache holds 24 arrays, and the kernel's
    non-inlined calls took each of them at every call."""
    return sfs_estimate(st, inbox, n_inbox, infl, infl_n, elapsed, first_gap, pred_total, q_rid, q_prompt, model,
                        st2, plan, max_steps, typ_out, lp)


@njit(cache=True, _nrt=False)
def sfs_estimate_p(st, inbox, n_inbox, infl, infl_n, elapsed, first_gap, pred_total, q_rid, q_prompt, model,
                   st2, plan, max_steps, typ_out, lp, overhead, intake, c, nm, cv, slo, buf):
    """``sfs_estimate_borrowed`` and then the estimate's P(TTFT <= slo)
    (``estimators.sfs.dist.sfs_p_on_time``) in one call from Python: what
    ``SFS.estimate`` followed by ``SFS.p_on_time`` computes, the same
    arithmetic in the same order (the estimate is max(est + overhead +
    intake, 0) as Python's ``max`` takes it). Returns the estimate, the
    kernel's steps, s1, s2, typ0 and the probability. For a state without
    the prefix cache (SFS's fused path), whose kernel never asks for the
    fallback on a copy of the cache. Numba's cache
    of this module is keyed by this file's stamp: a change to
    ``estimators.sfs.dist`` needs this file touched too."""
    est, steps, s1, s2, typ0 = sfs_estimate(st, inbox, n_inbox, infl, infl_n, elapsed, first_gap, pred_total, q_rid,
                                            q_prompt, model, st2, plan, max_steps, typ_out, lp, True)
    x = est + overhead + intake
    total = 0.0 if 0.0 > x else x  # Python's max(x, 0.0): x unless 0 is strictly greater
    return total, steps, s1, s2, typ0, sfs_p_on_time(total, s1, s2, steps, model.mult, c, nm, cv, typ0, elapsed,
                                                      slo, buf)
