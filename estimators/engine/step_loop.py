"""One event of an instance's engine loop, in Numba: the one function that
calls vLLM's schedule and completion rules (``kernel.schedule_step``,
``complete_step``) for everything that steps an instance: the twin
(``harness.twin.loop.kernel.advance``, sync and async scheduling; the
oracle's fork and ``serve``'s engine through it) and SFS
(``estimators.sfs.kernel``: the point estimate under either scheduling
mode, and through it the bound's fallback and the distribution, which
read its trajectory).

An instance is idle (``IDLE``), running a step (``RUNNING``, its end at
``T_END``) or between steps (``GAP``, its next schedule() at
``T_START``). ``loop_step`` runs whichever event is due: at a step's end its
outputs are applied (``update_from_output()``), then the inter-step gap
if any request remains (else idle); at the end of the gap the requests
that arrived meanwhile join ``waiting`` (vLLM's ``add_request`` before
``schedule()``), schedule() plans the next batch, and its duration is
charged. The caller decides when events are due (the twin: before the
next arrival; SFS: until the query's first token).

With vLLM's async scheduling (``M_ASYNC``) the same events run the engine
core's two-deep batch queue (``EngineCore.step_with_batch_queue``,
``docs/reference/async-scheduling.md`` section 1): the host plans step
N+1 while the device runs step N, so "the step in flight" is two batches
and the host's and the device's clocks part. GAP, at ``T_START``, is the
host's call (take in the inbox, schedule, launch: the device starts the
batch when the host has taken the joining requests in and the device is
free); RUNNING, at ``T_END``, the host waiting for the oldest batch, whose
outputs it applies once the device has finished it and the host has
launched its last batch. With the profile's ``host_share`` s, a batch's
typical time T splits into the host's input preparation (s T, expected,
before the launch) and the device's run ((1 - s) T), so the period
between steps is the larger of the device's and the host's time where the
synchronous mode charges their sum (``docs/concepts/batch-time.md``).

What differs between the callers is a parameter, not a copy:

- ``P_NOISE_ON``: a step's duration drawn from the noise model (the
  twin's truth) or charged its expected time, typical x ``model.mult``
  (SFS);
- ``P_GAP_WITH_STEP``: the clock's float order, (t + gap) + duration
  (the twin's clock: the gap ends, then the step runs) or t + (gap +
  duration) (SFS's sum of charges, ``T_GAP`` the gap still to charge);
  the results of both are pinned byte for byte;
- ``stop``: a slot whose refusal ends the loop (SFS's query: ``REFUSED``);
- ``out`` and ``log``: the per-request outcomes and the step log (the
  twin's), or ``None`` (SFS: compiled out, nothing recorded);
- ``T_INTAKE``: request intake already due, charged at the next
  schedule() with the inbox's (SFS's async estimate: the requests it
  enqueued itself).

The online speed factor (``SP_*`` sums) is the twin's to learn: its loop
observes a step's duration before applying its outputs.

The layouts below are the loop's, declared once: the twin's bundles
(``harness.twin.loop.parts``) and SFS's scratch (``scratch_arrays``)
hold them.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from estimators.engine.completion import BATCH_QUEUE
from estimators.engine.kernel import complete_step, drop_unservable_head, schedule_step
from estimators.engine.layout import (
    EV_FINISH,
    EV_FIRST,
    EV_LENGTH,
    F_EVENT,
    F_PREEMPTIONS,
    F_PROMPT,
    F_RID,
    F_STATUS,
    PL_N,
    PL_NREJ,
    S_NPREEMPT,
    S_NR,
    S_WN,
    ST_WAITING,
)
from estimators.engine.primitives import release_slot, wait_enqueue
from estimators.engine.timing import noisy_ratio, plan_time

# meta (int64) fields; M_SKIPPED: steps advanced by the twin's fast path (``_skip_run``), counted in M_STEPS too
M_BUSY, M_N, M_INBOX_N, M_STEPS, M_LOG_STEPS, M_LOG_ITEMS, M_LOG_PRE, M_SKIPPED = 0, 1, 2, 3, 4, 5, 6, 7
# async scheduling: 1 on an async instance; the queued batch's size; batches in vLLM's two-deep batch queue
# (planned, outputs not applied yet)
M_ASYNC, M_N2, M_Q = 8, 9, 10
IDLE, RUNNING, GAP = 0, 1, 2  # async: RUNNING = the host waits for the oldest batch's outputs (due at T_END)
# a steady run left in flight (the twin's ``_skip_run``): its steps still to come after the one in flight (0: none
# known; any other step resets it) and the decodes' computed-token sums S1, S2 before the first of them
M_RUN_LEFT, M_RUN_S1, M_RUN_S2 = 11, 12, 13
# the steps ahead a run's horizon drew (``harness.twin.loop.run_memo``): how many, their batch size and the
# decodes' computed-token sums before the first
M_AH_N, M_AH_NB, M_AH_S1, M_AH_S2 = 14, 15, 16, 17
NM = 18
# params (float64) fields
P_NOISE_ON, P_LOG_ON, P_INTAKE_REQ, P_INTAKE_TOK = 0, 1, 2, 3  # intake: s per joining request and prompt token
P_SKIP_ON = 4  # the twin advances runs of steady decode steps without the scheduler kernel (``_skip_run``)
P_HOST_SHARE = 5  # async scheduling: the host's share of a step's time (the profile's ``host_share``)
P_GAP_WITH_STEP = 6  # 1: a step's end is t + (gap + duration), SFS's sum (0: (t + gap) + duration, the twin's clock)
NP_ = 7
# times (float64): in-flight step start (or, between steps, the next schedule) and end (hidden from routers)
T_START, T_END = 0, 1
# async scheduling: the device's start and end of the oldest batch (A) and of the queued one (B), B's
# launch and the last launch (the host's clock: when it was ready for its next call)
T_A0, T_A1, T_B0, T_B1, T_LB, T_LAUNCH = 2, 3, 4, 5, 6, 7
# P_GAP_WITH_STEP: the gap the next step is charged with (T_START is then the last step's end); request intake
# due at the next schedule() besides the inbox's
T_GAP, T_INTAKE = 8, 9
NT = 10
# speed (float64): the running host-speed factor learned from completed steps (estimators.timemodel.online_speed):
# weighted sums of clipped log(actual / the profile's typical), their decay per step, the profile's
# baseline log ratio, the clip, the in-flight step's typical time by the profile, the host's true speed,
# and the factor itself (exp(num / den), 1 before any step)
SP_NUM, SP_DEN, SP_LAM, SP_BASE, SP_CLIP, SP_TYP, SP_HOST, SP_FACTOR = 0, 1, 2, 3, 4, 5, 6, 7
SP_TYP2 = 8  # async scheduling: the queued batch's typical time (SP_TYP is the oldest's)
NSP = 9

OK, NO_ROOM, REFUSED = 0, 1, 2  # ``loop_step``'s returns: done; (async) the step log is full; ``stop`` was refused

# SFS's scratch (``scratch_arrays``): one int64 array holding every field above and a noise stream
_O_T = NM
_O_P = _O_T + NT
_O_SP = _O_P + NP_
_O_RNG = _O_SP + NSP
SCRATCH_WORDS = _O_RNG + 4


class StepArrays(NamedTuple):
    """The arrays ``loop_step`` reads besides the state and the plans (the
    twin's ``TwinArrays`` holds them under the same names, with more)."""

    inbox: np.ndarray  # slots arrived, not yet handed to the scheduler (first meta[M_INBOX_N])
    meta: np.ndarray  # M_*
    times: np.ndarray  # T_*
    params: np.ndarray  # P_*
    rng: np.ndarray  # xoshiro256** state
    speed: np.ndarray  # SP_*


@njit(cache=True, inline="always")
def scratch_arrays(buf):
    """``StepArrays`` over one int64 array of ``SCRATCH_WORDS`` (views, no
    copy, no allocation: SFS is handed one array per call, not six),
    zeroed; no inbox, the speed's host factor 1 (``SP_TYP`` is then the
    planned batch's typical time). Inlined: a compiled function that
    returns new arrays (these views) must be compiled with its caller's
    runtime setting, and SFS's callers run with and without Numba's
    runtime (``_nrt=False``); one compiled copy shared by both would
    leave the views' reference counts unbalanced in one of them."""
    for i in range(SCRATCH_WORDS):
        buf[i] = 0
    sp = buf[_O_SP:_O_RNG].view(np.float64)
    sp[SP_HOST] = 1.0
    return StepArrays(buf[:0], buf[:NM], buf[_O_T:_O_P].view(np.float64), buf[_O_P:_O_SP].view(np.float64),
                      buf[_O_RNG:SCRATCH_WORDS].view(np.uint64), sp)


@njit(cache=True)
def log_room(tw, log, cap):
    """Room in the step log for one more step of up to ``cap`` items and preemptions."""
    meta = tw.meta
    return (meta[M_LOG_STEPS] < log.n.size and meta[M_LOG_ITEMS] + cap <= log.items.shape[0]
            and meta[M_LOG_PRE] + cap <= log.pre.size)


@njit(cache=True, inline="always")
def record_slot(st, s, t, out):
    """The outcomes of slot ``s`` whose outputs were just applied at ``t``
    (``complete_step`` set its events): its first token, its finish, the
    preemptions a finished request went through, a finish at max_model_len."""
    ev = st.req[s, F_EVENT]
    rid = st.req[s, F_RID]
    if ev & EV_FIRST:
        out.first_t[rid] = t
    if ev & EV_FINISH:
        out.finish_t[rid] = t
        out.preempt_n[rid] = st.req[s, F_PREEMPTIONS]
        if ev & EV_LENGTH:
            out.length_capped[rid] = 1


@njit(cache=True, inline="always")
def write_step(st, plan, tw, log, n, start, end):
    """Append a step (``plan.*[:n]`` and the preemptions its schedule()
    made) to the step log, which the caller checked has room."""
    meta = tw.meta
    npre = st.sc[S_NPREEMPT]
    k = meta[M_LOG_STEPS]
    log.t[k, 0] = start
    log.t[k, 1] = end
    log.n[k] = n
    log.npre[k] = npre
    base = meta[M_LOG_ITEMS]
    for j in range(n):
        s = plan.slot[j]
        log.items[base + j, 0] = st.req[s, F_RID]
        log.items[base + j, 1] = plan.tokens[j]
        log.items[base + j, 2] = plan.computed[j]
        log.items[base + j, 3] = st.req[s, F_PROMPT]
    for j in range(npre):
        log.pre[meta[M_LOG_PRE] + j] = st.req[plan.preempted[j], F_RID]
    meta[M_LOG_STEPS] = k + 1
    meta[M_LOG_ITEMS] = base + n
    meta[M_LOG_PRE] += npre


@njit(cache=True)
def take_inbox(st, tw) -> float:
    """vLLM's ``add_request`` before ``schedule()``: the requests that
    arrived since the last plan join the waiting queue in arrival order
    (priority scheduling: each at its place by priority).
    Returns their intake time (``estimators.timemodel.intake``) after
    ``T_INTAKE``'s, which delays the step (sync) or the launch (async)."""
    meta, times = tw.meta, tw.times
    intake = times[T_INTAKE]
    times[T_INTAKE] = 0.0
    for i in range(meta[M_INBOX_N]):
        s = tw.inbox[i]
        st.req[s, F_STATUS] = ST_WAITING
        wait_enqueue(st.cfg, st.req, st.sc, st.waiting, s)  # priority scheduling: at its place
        intake += tw.params[P_INTAKE_REQ] + tw.params[P_INTAKE_TOK] * st.req[s, F_PROMPT]
    meta[M_INBOX_N] = 0
    return intake


@njit(cache=True)
def take_queued(plan, plan2, n):
    """The first ``n`` items of ``plan2`` into ``plan`` (async: the queued
    batch becomes the oldest; the views hold ``plan`` as the in-flight one)."""
    for j in range(n):
        plan.slot[j] = plan2.slot[j]
        plan.tokens[j] = plan2.tokens[j]
        plan.computed[j] = plan2.computed[j]
        plan.rid[j] = plan2.rid[j]
        plan.samples[j] = plan2.samples[j]
        plan.preemptions[j] = plan2.preemptions[j]
    plan.counts[PL_N] = n


@njit(cache=True, inline="always")  # inlined: a call passes every array of its bundles (SFS measured ~2x a step)
def loop_step(st, plan, plan2, tw, model, out, log, stop):
    """Run the instance's due event (``meta[M_BUSY]``): RUNNING, apply the
    (oldest) batch's outputs at ``T_END``; else the schedule() at
    ``T_START``. ``plan`` is the batch in flight (async: the oldest),
    ``plan2`` the queued one (async only). Returns ``OK``, ``NO_ROOM``
    (async, nothing done: the step log is full) or ``REFUSED`` (``stop``
    was refused; the rest of the schedule() is not done).

    Outputs: tokens and finishes stamped (``out``), then the inter-step gap
    before the next call if any request remains, else (async) the wait for
    the queued batch, or idle. Async, a slot reused since the batch was
    planned gets no events of it, and the queued batch becomes the oldest.

    schedule(): the inbox joins ``waiting``, the scheduler plans; requests
    it refuses are rejected, and when nothing runs and the waiting head can
    never be admitted the head is rejected and the scheduler asked again.
    The batch starts once the engine has taken in the joining requests
    (``estimators.timemodel.intake``) and, async, the host has prepared its
    input and the device is free; requests arriving meanwhile join the
    next call. Async, the batch goes into ``plan`` when nothing is queued,
    else into ``plan2``, and the host's next call follows at once while
    fewer than two batches are queued (vLLM returns without waiting)."""
    meta, times, sp = tw.meta, tw.times, tw.speed
    asy = meta[M_ASYNC] != 0
    q = meta[M_Q]  # 0 on a synchronous instance
    if meta[M_BUSY] == RUNNING:
        t = times[T_END]
        n = meta[M_N]
        complete_step(st, plan, n)
        if out is not None:
            for j in range(n):
                s = plan.slot[j]
                if not asy or st.req[s, F_RID] == plan.rid[j]:  # a reused slot's events are its new request's
                    record_slot(st, s, t, out)
        if asy:
            q -= 1
            if q > 0:
                take_queued(plan, plan2, meta[M_N2])
                meta[M_N] = meta[M_N2]
                times[T_A0] = times[T_B0]
                times[T_A1] = times[T_B1]
                sp[SP_TYP] = sp[SP_TYP2]
            else:
                meta[M_N] = 0
            meta[M_N2] = 0
            meta[M_Q] = q
        else:
            meta[M_N] = 0
        if st.sc[S_NR] + st.sc[S_WN] + meta[M_INBOX_N] > 0:
            meta[M_BUSY] = GAP
            if tw.params[P_GAP_WITH_STEP] > 0.0:
                times[T_START] = t
                times[T_GAP] = model.gap
            else:
                times[T_START] = t + model.gap
        elif q > 0:
            meta[M_BUSY] = RUNNING  # nothing left to plan: wait for the last batch (its outputs are dropped)
            times[T_END] = t if t > times[T_A1] else times[T_A1]
        else:
            meta[M_BUSY] = IDLE
        return OK
    t = times[T_START]
    x = plan if q == 0 else plan2
    if log is not None:
        if asy and tw.params[P_LOG_ON] > 0.0 and not log_room(tw, log, x.slot.size):
            return NO_ROOM
    meta[M_RUN_LEFT] = 0
    intake = take_inbox(st, tw)
    while True:
        n = schedule_step(st, x)
        for r in range(x.counts[PL_NREJ]):
            s = x.rejected[r]
            if s == stop:
                return REFUSED
            if out is not None:
                out.reject_t[st.req[s, F_RID]] = t
            release_slot(st, s)
        if n > 0 or st.sc[S_NR] > 0 or st.sc[S_WN] == 0:
            break
        s = drop_unservable_head(st)
        if s == stop:
            return REFUSED
        if out is not None:
            out.reject_t[st.req[s, F_RID]] = t
        release_slot(st, s)
    if n == 0 and q == 0:  # nothing queued, nothing schedulable: idle until an arrival
        meta[M_BUSY] = IDLE
        meta[M_N] = 0
        return OK
    typical = 0.0
    dur = 0.0
    prep = 0.0
    if n > 0:
        if out is not None:
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
        times[T_END] = launch + (times[T_GAP] + dur) if tw.params[P_GAP_WITH_STEP] > 0.0 else launch + dur
        meta[M_BUSY] = RUNNING
        meta[M_N] = n
        return OK
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
    if log is not None:
        if n > 0 and tw.params[P_LOG_ON] > 0.0:
            write_step(st, x, tw, log, n, start, start + dur)  # the device's start and end
    meta[M_Q] = q + 1
    times[T_LAUNCH] = launch
    if q + 1 < BATCH_QUEUE and (n > 0 or st.sc[S_NR] + st.sc[S_WN] > 0):
        meta[M_BUSY] = GAP  # vLLM returns at once: the next plan, from the state before this batch's outputs
        times[T_START] = launch
    else:
        meta[M_BUSY] = RUNNING
        times[T_END] = launch if launch > times[T_A1] else times[T_A1]
    return OK
