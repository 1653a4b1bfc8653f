"""The engine twin's inner loop, in Numba: run one instance's steps up to a
time, each event (a step's end, the next schedule()) the engine loop's
``loop_step`` (``estimators.engine.step_loop``: vLLM's rules, sync or async
scheduling, the step's true duration drawn from the batch-time profile and
its noise), the twin's own part the step log, the online speed factor and
the skipping of steady runs.

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

from estimators.engine.layout import (
    F_COMPUTED,
    F_PROMPT,
    F_RID,
    PL_N,
    PL_NREJ,
    S_NPREEMPT,
    S_NR,
    S_STEP,
    KernelInputError,
)
from estimators.engine.step_loop import OK, loop_step, write_step
from harness.twin.loop import run_memo
from harness.twin.loop.parts import (
    GAP,
    M_AH_N,
    M_ASYNC,
    M_BUSY,
    M_INBOX_N,
    M_LOG_ITEMS,
    M_LOG_PRE,
    M_LOG_STEPS,
    M_N,
    M_RUN_LEFT,
    M_RUN_S1,
    M_RUN_S2,
    M_SKIPPED,
    M_STEPS,
    P_LOG_ON,
    P_NOISE_ON,
    P_SKIP_ON,
    RUNNING,
    SP_DEN,
    SP_FACTOR,
    SP_HOST,
    SP_NUM,
    SP_TYP,
    T_A0,
    T_A1,
    T_END,
    T_START,
    _observe_speed,
    _observe_sums,
)
from harness.twin.loop.skip import apply_run, steady_run, take_batch


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
    from the same expressions as ``loop_step`` and ``advance``; the
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
            t_start = t + 0.0  # nobody joins: loop_step's start and end (intake 0), term by term
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

    The one loop of both scheduling modes (``M_ASYNC``): each due event
    (a step's end, the next schedule()) is the engine loop's ``loop_step``
    (``estimators.engine.step_loop``), the step's duration observed into
    the speed factor before its outputs are applied. Synchronous, with ``P_SKIP_ON``, a run of steady decode
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
            if asy:  # (async logs a batch when it is planned)
                if meta[M_N] > 0:
                    _observe_speed(tw.speed, times[T_A1] - times[T_A0])
            else:
                if tw.params[P_LOG_ON] > 0.0 and not _log_step(st, plan, tw, log, meta[M_N], times[T_END]):
                    return 1
                _observe_speed(tw.speed, times[T_END] - times[T_START])
            loop_step(st, plan, tw.plan2, tw, model, out, log, -1)
            skipped = False
        elif busy == GAP and times[T_START] <= t_until:
            if skip and not skipped and meta[M_INBOX_N] == 0 and _skip_run(t_until, st, plan, tw, model, log) > 0:
                skipped = True
                continue
            if loop_step(st, plan, tw.plan2, tw, model, out, log, -1) != OK:
                return 1
        else:
            return 0
