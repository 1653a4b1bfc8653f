"""The engine twin's inner loop, in Numba: run one instance's steps up to a
time, applying each step's outputs, taking in requests that arrived in the
meantime at the next schedule(), scheduling with the shared kernel and
drawing each step's true duration from the batch-time profile and its noise.

An instance is idle (0), running a step (1) or between steps (2): after a
step ends with work left, or when an arrival wakes an idle engine, the
engine spends the profile's inter-step gap (output handling, request intake)
and then runs schedule(); requests that arrive during the gap are part of
that schedule(), as in vLLM's engine loop.

With vLLM's async scheduling (``M_ASYNC``) the same loop runs the engine
core's two-deep batch queue (``EngineCore.step_with_batch_queue``,
``docs/reference/async-scheduling.md`` section 1) over the one scheduler
kernel in its async mode: the host plans step N+1 while the device runs
step N, so "the step in flight" is two batches and the host's and the
device's clocks part. GAP, at ``T_START``, is the host's call (take in the
inbox, schedule, launch: the device starts the batch when the host has
taken the joining requests in and the device is free); RUNNING, at
``T_END``, the host waiting for the oldest batch, whose outputs it applies
once the device has finished it and the host has launched its last batch.
With the profile's ``host_share`` s, a batch's typical time T splits into
the host's input preparation (s T, expected, before the launch) and the
device's run ((1 - s) T, with the noise), so the period between steps is
the larger of the device's and the host's time where the synchronous mode
charges their sum (``docs/concepts/batch-time.md``). The step log has the
device's start and end of each non-empty batch, logged when it is planned
(its preemptions are known then). SFS follows the same loop
(``estimators.sfs.async_kernel``).

Python calls ``advance`` for every instance before each arrival (so the
router sees every instance as it is at that moment) and wakes an idle
instance an arrival finds (``Instance.kick``: the gap starts); everything
between arrivals stays in Numba.

Exact event skipping (``P_SKIP_ON``, ``TwinConfig.skip``): where a run of
steady decode steps starts (``harness.twin.loop.skip``: every running request
one decode token, the same batch step after step, until a finish, the KV
headroom or ``t_until``), ``_skip_run`` advances it without the scheduler
kernel: the same floats in the same order, the same noise draws, the same
step log, the request table brought forward once. Everything else is
scheduled step by step.

``advance`` and ``run_horizon`` are compiled without Numba's runtime
(``_nrt=False``): they allocate nothing, and their inner calls then take
the bundles' arrays without reference counting (the fleet kernel's
borrowed bundles, ``harness.twin.loop.borrow``, need it). So nothing they call
may allocate (``timing.interp_one``, ``run_memo.write``'s rows).

Bundles: the instance's ``SchedState`` and ``StepPlan`` (the in-flight
step), ``TwinArrays`` (inbox, meta, times, params, noise stream), the
``TimeModel``, ``Outcomes`` (per-request times, indexed by trace position)
and ``LogBuffers`` (the step log, flushed by Python when full).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from estimators.engine.completion import BATCH_QUEUE
from estimators.engine.kernel import complete_step
from estimators.engine.layout import (
    F_COMPUTED,
    F_PROMPT,
    F_RID,
    PL_N,
    PL_NREJ,
    S_NPREEMPT,
    S_NR,
    S_STEP,
    S_WN,
    KernelInputError,
)
from estimators.engine.timing import noisy_ratio, plan_time
from harness.twin.loop import run_memo
from harness.twin.loop.parts import (  # noqa: F401 (the bundles' layouts, read as tk.* by the instance and the fleet)
    GAP,
    IDLE,
    M_AH_N,
    M_ASYNC,
    M_BUSY,
    M_INBOX_N,
    M_LOG_ITEMS,
    M_LOG_PRE,
    M_LOG_STEPS,
    M_N,
    M_N2,
    M_Q,
    M_RUN_LEFT,
    M_RUN_S1,
    M_RUN_S2,
    M_SKIPPED,
    M_STEPS,
    NM,
    NP_,
    NSP,
    NT,
    P_HOST_SHARE,
    P_INTAKE_REQ,
    P_INTAKE_TOK,
    P_LOG_ON,
    P_NOISE_ON,
    P_SKIP_ON,
    RUNNING,
    SP_BASE,
    SP_CLIP,
    SP_DEN,
    SP_FACTOR,
    SP_HOST,
    SP_LAM,
    SP_NUM,
    SP_TYP,
    SP_TYP2,
    T_A0,
    T_A1,
    T_B0,
    T_B1,
    T_END,
    T_LAUNCH,
    T_LB,
    T_START,
    LogBuffers,
    Outcomes,
    TwinArrays,
    _observe_speed,
    _observe_sums,
    record_events,
    record_slot,
    schedule_or_reject,
    take_inbox,
    write_step,
)
from harness.twin.loop.skip import apply_run, steady_run, take_batch


@njit(cache=True)
def _log_room(tw, log, cap):
    """Room in the step log for one more step of up to ``cap`` items and preemptions."""
    meta = tw.meta
    return (meta[M_LOG_STEPS] < log.n.size and meta[M_LOG_ITEMS] + cap <= log.items.shape[0]
            and meta[M_LOG_PRE] + cap <= log.pre.size)


@njit(cache=True)
def _plan(t, st, plan, tw, model, out, log, asy):
    """schedule() at ``t`` (sync: the step; ``asy``: the host's call): take
    in the inbox, schedule, draw the duration, launch. The batch starts
    once the engine has taken in the joining requests
    (``estimators.timemodel.intake``: vLLM's ``add_request`` before
    ``schedule()``) and, async, the host has prepared its input and the
    device is free; requests arriving meanwhile join the next call.
    Async, the batch goes into ``plan`` when nothing is queued, else into
    ``plan2``, and the host's next call follows at once while fewer than
    two batches are queued (vLLM returns without waiting). Returns False
    (nothing done) when an async step log has no room."""
    meta, times, sp = tw.meta, tw.times, tw.speed
    q = meta[M_Q]  # 0 on a synchronous instance
    x = plan if q == 0 else tw.plan2
    log_on = tw.params[P_LOG_ON] > 0.0
    if asy and log_on and not _log_room(tw, log, x.slot.size):
        return False
    meta[M_RUN_LEFT] = 0
    intake = take_inbox(st, tw)
    n = schedule_or_reject(st, x, out, t)
    if n == 0 and q == 0:  # nothing queued, nothing schedulable: idle until an arrival
        meta[M_BUSY] = IDLE
        meta[M_N] = 0
        return True
    typical = 0.0
    dur = 0.0
    prep = 0.0
    if n > 0:
        for j in range(n):
            rid = st.req[x.slot[j], F_RID]
            if out.cached[rid] < 0:
                out.cached[rid] = x.computed[j]
        whole = plan_time(model, st.req, x, n)
        typical = whole
        if asy:
            share = tw.params[P_HOST_SHARE]
            typical = whole * (1.0 - share)  # the device's part (all of it at share 0)
            prep = whole * share * model.mult  # the host's input preparation before the launch, expected
        if tw.params[P_NOISE_ON] > 0.0:
            dur = typical * noisy_ratio(model.noise, model.stall_q, model.stall_v, tw.rng)
        else:
            dur = typical * model.mult
        meta[M_STEPS] += 1
    launch = t + intake + prep
    if not asy:
        sp[SP_TYP] = typical / sp[SP_HOST]  # what the profile (the estimators' view) says
        times[T_START] = launch
        times[T_END] = launch + dur
        meta[M_BUSY] = RUNNING
        meta[M_N] = n
        return True
    if q == 0:
        start = launch
        times[T_A0] = start
        times[T_A1] = start + dur
        meta[M_N] = n
        sp[SP_TYP] = typical / sp[SP_HOST]
    else:
        start = launch if launch > times[T_A1] else times[T_A1]
        times[T_B0] = start
        times[T_B1] = start + dur
        times[T_LB] = launch
        meta[M_N2] = n
        sp[SP_TYP2] = typical / sp[SP_HOST]
    if n > 0 and log_on:
        write_step(st, x, tw, log, n, start, start + dur)  # the device's start and end
    meta[M_Q] = q + 1
    times[T_LAUNCH] = launch
    if q + 1 < BATCH_QUEUE and (n > 0 or st.sc[S_NR] + st.sc[S_WN] > 0):
        meta[M_BUSY] = GAP  # vLLM returns at once: the next plan, from the state before this batch's outputs
        times[T_START] = launch
    else:
        meta[M_BUSY] = RUNNING
        times[T_END] = launch if launch > times[T_A1] else times[T_A1]
    return True


@njit(cache=True)
def _take_queued(plan, plan2, n):
    """Async: the queued batch becomes the oldest: ``plan2``'s items into
    ``plan`` (the views hold ``plan`` as the in-flight batch)."""
    for j in range(n):
        plan.slot[j] = plan2.slot[j]
        plan.tokens[j] = plan2.tokens[j]
        plan.computed[j] = plan2.computed[j]
        plan.rid[j] = plan2.rid[j]
        plan.samples[j] = plan2.samples[j]
        plan.preemptions[j] = plan2.preemptions[j]
    plan.counts[PL_N] = n


@njit(cache=True, inline="always")
def _complete(st, plan, tw, model, out, asy):
    """At ``T_END`` the (oldest) batch's outputs are applied: tokens and
    finishes stamped, the speed factor updated; then the inter-step gap
    before the next call if any request remains, else (async) the wait for
    the queued batch, or idle. Async, a slot reused since the batch was
    planned gets no events of it, and the queued batch becomes the oldest."""
    meta, times, sp = tw.meta, tw.times, tw.speed
    t = times[T_END]
    n = meta[M_N]
    complete_step(st, plan, n)
    if not asy:
        _observe_speed(sp, t - times[T_START])
        record_events(st, plan, n, t, out)
        meta[M_N] = 0
        q = 0
    else:
        if n > 0:
            _observe_speed(sp, times[T_A1] - times[T_A0])
        for j in range(n):
            s = plan.slot[j]
            if st.req[s, F_RID] == plan.rid[j]:  # a reused slot's events are its new request's
                record_slot(st, s, t, out)
        q = meta[M_Q] - 1
        if q > 0:
            _take_queued(plan, tw.plan2, meta[M_N2])
            meta[M_N] = meta[M_N2]
            times[T_A0] = times[T_B0]
            times[T_A1] = times[T_B1]
            sp[SP_TYP] = sp[SP_TYP2]
        else:
            meta[M_N] = 0
        meta[M_N2] = 0
        meta[M_Q] = q
    if st.sc[S_NR] + st.sc[S_WN] + meta[M_INBOX_N] > 0:
        meta[M_BUSY] = GAP
        times[T_START] = t + model.gap
    elif q > 0:
        meta[M_BUSY] = RUNNING  # nothing left to plan: wait for the last batch (its outputs are dropped)
        times[T_END] = t if t > times[T_A1] else times[T_A1]
    else:
        meta[M_BUSY] = IDLE


@njit(cache=True)
def _log_step(st, plan, tw, log, n, t_end):
    """Append the finished step to the log; False if the log is full."""
    meta = tw.meta
    npre = st.sc[S_NPREEMPT]
    if (meta[M_LOG_STEPS] >= log.n.size or meta[M_LOG_ITEMS] + n > log.items.shape[0]
            or meta[M_LOG_PRE] + npre > log.pre.size):
        return False
    write_step(st, plan, tw, log, n, tw.times[T_START], t_end)
    return True


@njit(cache=True)
def _log_steady(st, plan, tw, log, n, j, t_start, t_end):
    """``_log_step`` for step ``j`` of a steady run (``_skip_run``): the
    batch of ``plan`` with every computed-before token ``j`` further on
    than the request table's (brought forward after the run); the caller
    checked the room."""
    meta, req = tw.meta, st.req
    k = meta[M_LOG_STEPS]
    log.t[k, 0] = t_start
    log.t[k, 1] = t_end
    log.n[k] = n
    log.npre[k] = 0
    base = meta[M_LOG_ITEMS]
    for i in range(n):
        s = plan.slot[i]
        log.items[base + i, 0] = req[s, F_RID]
        log.items[base + i, 1] = 1
        log.items[base + i, 2] = req[s, F_COMPUTED] + j
        log.items[base + i, 3] = req[s, F_PROMPT]
    meta[M_LOG_STEPS] = k + 1
    meta[M_LOG_ITEMS] = base + n


@njit(cache=True)
def _skip_run(t_until, st, plan, tw, model, log):
    """Between steps, where a steady run starts (``harness.twin.loop.skip``):
    run its steps without the scheduler kernel. Each step's
    typical time comes from the decodes' running sums, its noise from the
    same stream in the same order, its start, end and the speed factor
    from the same expressions as ``_plan`` and ``advance``; the
    request table is brought forward once at the end (``apply_run``), the
    last step left in flight if it ends after ``t_until``. Returns the
    steps scheduled (0: not a steady run; the caller schedules as usual)."""
    meta, times, sp = tw.meta, tw.times, tw.speed
    k, s1, s2 = steady_run(st, plan, plan.counts[PL_N] if plan.counts[PL_NREJ] == 0 else -1)
    n = st.sc[S_NR]
    log_on = tw.params[P_LOG_ON] > 0.0
    if log_on and k > 0:
        k = min(k, log.n.size - meta[M_LOG_STEPS], (log.items.shape[0] - meta[M_LOG_ITEMS]) // n)
    if k <= 0:
        return 0
    take_batch(st, plan, n)
    plan.counts[PL_N] = n
    plan.counts[PL_NREJ] = 0
    noise_on = tw.params[P_NOISE_ON] > 0.0
    t = times[T_START]
    t_start = t
    t_end = times[T_END]
    done = 0
    flight = False
    rng, ahead, ahead_rng = tw.rng, tw.ahead, tw.ahead_rng
    j0 = run_memo.find(tw, n, s1, s2, t)  # the run's steps the horizon drew already (``run_memo``)
    m_n = meta[M_AH_N] if j0 >= 0 else 0
    counted = False
    while done < k and t <= t_until:
        j = j0 + done
        if j0 >= 0 and j < m_n:  # drawn by the horizon: the same floats, the stream moved past its draws
            typical = ahead[j, 2]
            t_start = ahead[j, 0]
            t_end = ahead[j, 1]
            for i in range(4):
                rng[i] = ahead_rng[j + 1, i]
        else:
            typical, dur = run_memo.step_time(model, n, s1, s2, done, rng, noise_on)
            t_start = t + 0.0  # nobody joins: _plan's start and end (intake 0), term by term
            t_end = t + 0.0 + dur
        sp[SP_TYP] = typical / sp[SP_HOST]
        if not t_end <= t_until:
            flight = True
            break
        if log_on:
            _log_steady(st, plan, tw, log, n, done, t_start, t_end)
        if _observe_sums(sp, t_end - t_start):
            counted = True
        done += 1
        t = t_end + model.gap
    if counted:  # _observe_speed's factor, once: nothing in the run reads it
        sp[SP_FACTOR] = np.exp(sp[SP_NUM] / sp[SP_DEN])
    scheduled = done + 1 if flight else done
    apply_run(st, plan, n, scheduled, done)
    st.sc[S_STEP] += scheduled
    meta[M_STEPS] += scheduled
    meta[M_SKIPPED] += scheduled
    if flight:
        times[T_START] = t_start
        times[T_END] = t_end
        meta[M_BUSY] = RUNNING
        meta[M_N] = n
        meta[M_RUN_LEFT] = k - scheduled  # the run's steps after this one (run_horizon)
        meta[M_RUN_S1] = s1 + n * scheduled
        meta[M_RUN_S2] = s2 + 2 * scheduled * s1 + n * scheduled * scheduled
    else:
        times[T_START] = t
        times[T_END] = t_end
        meta[M_RUN_LEFT] = 0
    return scheduled


@njit(cache=True, inline="always")
def next_event(tw):
    """When ``advance`` next has work (``Instance.due``): the in-flight
    step's end, the end of the gap (the next schedule()), or never (idle)."""
    busy = tw.meta[M_BUSY]
    return tw.times[T_END] if busy == RUNNING else (tw.times[T_START] if busy == GAP else np.inf)


@njit(cache=True, _nrt=False)
def run_horizon(tw, model):
    """When this instance's resident count can next change, at the
    earliest: after the last step of the steady run whose step is in
    flight (``_skip_run`` left ``M_RUN_LEFT`` steps of it to come), else
    its next event (``Instance.due``). A run's steps finish nobody, take
    nobody in and preempt nobody (``harness.twin.loop.skip``), and they are
    the steps the scheduler will run whatever the calls that advance them
    (the event-skipping invariant), so until the run's last step ends a
    router that reads only resident counts sees the same numbers whether
    or not the instance has been advanced. The times are the run's own:
    ``_skip_run``'s expressions from the same sums, its noise drawn from a
    copy of the stream (the stream is left as it was), written ahead
    (``run_memo``) for the run's steps to take; a run longer than
    ``run_memo.AHEAD`` steps gives its last written step's end (an early
    wake: the instance is advanced there and asked again)."""
    meta, times = tw.meta, tw.times
    if meta[M_BUSY] != RUNNING:
        return next_event(tw)
    d = times[T_END]
    left = meta[M_RUN_LEFT]
    if left <= 0 or meta[M_INBOX_N] != 0 or meta[M_ASYNC] != 0:
        return d
    n = meta[M_N]
    s1, s2 = meta[M_RUN_S1], meta[M_RUN_S2]
    t = d + model.gap
    j = run_memo.find(tw, n, s1, s2, t)
    if j >= 0 and j + left <= meta[M_AH_N]:
        return tw.ahead[j + left - 1, 1]
    return run_memo.write(tw, model, n, s1, s2, t, left, model.gap)


@njit(cache=True, _nrt=False)
def advance(t_until, st, plan, tw, model, out, log):
    """Run every step that ends at or before ``t_until`` (async: every host
    call due by then). Returns 1 when the step log is full (the caller
    flushes it and calls again), else 0.

    The one loop of both scheduling modes (``M_ASYNC``): a due end applies
    the (oldest) batch's outputs (``_complete``), a due call plans the next
    (``_plan``). Synchronous, with ``P_SKIP_ON``, a run of steady decode
    steps is advanced by ``_skip_run`` (same results, a fraction of the
    work); after one run, the next step is scheduled as usual (the run
    stopped where something changes). Async has no event skipping: every
    step is scheduled."""
    meta, times = tw.meta, tw.times
    if not t_until >= -1e300:  # NaN or -inf: no step would ever be due, or every one; +inf drains
        raise KernelInputError("the twin was asked to advance to a time that is not a number")
    asy = meta[M_ASYNC] != 0
    skip = not asy and tw.params[P_SKIP_ON] > 0.0
    skipped = False
    while True:
        busy = meta[M_BUSY]
        if busy == RUNNING and times[T_END] <= t_until:
            if not asy and tw.params[P_LOG_ON] > 0.0 and not _log_step(st, plan, tw, log, meta[M_N], times[T_END]):
                return 1  # (async logs a batch when it is planned)
            _complete(st, plan, tw, model, out, asy)
            skipped = False
        elif busy == GAP and times[T_START] <= t_until:
            if skip and not skipped and meta[M_INBOX_N] == 0 and _skip_run(t_until, st, plan, tw, model, log) > 0:
                skipped = True
                continue
            if not _plan(times[T_START], st, plan, tw, model, out, log, asy):
                return 1
        else:
            return 0
