"""The engine twin's loop for an instance with vLLM's async scheduling:
the engine core's two-deep batch queue (``EngineCore.step_with_batch_queue``,
``docs/reference/async-scheduling.md`` section 1) over the one scheduler
kernel in its async mode.

Why a loop of its own: under async scheduling the host plans step N+1
while the device runs step N, so "the step in flight" is two batches, and
the host's and the device's clocks part. The synchronous loop
(``harness.twin.loop.kernel``) charges a step its device time and then the
host's inter-step gap; here the host's work overlaps the device's.

The host makes calls, one at a time (``M_BUSY``):

- GAP, at ``T_START``: take in the inbox, ``schedule_step`` (into ``plan``
  when nothing is queued, else ``plan2``) and launch the batch: the device
  starts it when the host has taken the joining requests in and the device
  is free (the end of the batch before it), and runs it for its drawn
  duration (an empty batch takes none). If fewer than two batches are
  queued and the batch ran tokens or requests remain, the next call
  follows at once (vLLM returns without waiting); otherwise the host waits.
- RUNNING, at ``T_END``: the host waits for the oldest batch and applies its
  outputs (``complete_step``) when the device has finished it and the host
  has launched its last batch: tokens and finishes are stamped then. Then
  the inter-step gap (the host's output handling and scheduling) before the
  next call, if any request remains; else it waits for the next batch, or
  goes idle.

With the profile's ``host_share`` s, a batch's typical time T splits into
the host's input preparation (s T, expected, before the launch) and the
device's run ((1 - s) T, with the noise). So the period between steps is
the larger of the device's and the host's time (the gap plus the next
batch's preparation) where the synchronous loop charges their sum
(``docs/concepts/batch-time.md``). The step log
has the device's start and end of each non-empty batch, logged when it is
planned (its preemptions are known then). No event skipping here
(``harness.twin.loop.skip`` is the synchronous loop's): every step is scheduled.
SFS follows the same loop (``estimators.sfs.async_kernel``).
"""
from __future__ import annotations

from numba import njit

from estimators.engine.kernel import complete_step
from estimators.engine.layout import (
    F_RID,
    PL_N,
    S_NR,
    S_WN,
)
from estimators.engine.timing import noisy_ratio, plan_time
from harness.twin.loop.parts import (
    GAP,
    IDLE,
    M_BUSY,
    M_INBOX_N,
    M_LOG_ITEMS,
    M_LOG_PRE,
    M_LOG_STEPS,
    M_N,
    M_N2,
    M_Q,
    M_STEPS,
    P_HOST_SHARE,
    P_LOG_ON,
    P_NOISE_ON,
    RUNNING,
    SP_HOST,
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
    _observe_speed,
    record_slot,
    schedule_or_reject,
    take_inbox,
    write_step,
)

BATCH_QUEUE = 2  # vLLM's max_concurrent_batches with async scheduling and no pipeline parallelism


@njit(cache=True)
def _log_room(tw, log, cap):
    """Room in the step log for one more step of up to ``cap`` items and preemptions."""
    meta = tw.meta
    return (meta[M_LOG_STEPS] < log.n.size and meta[M_LOG_ITEMS] + cap <= log.items.shape[0]
            and meta[M_LOG_PRE] + cap <= log.pre.size)


@njit(cache=True)
def _plan(t, st, plan, tw, model, out, log):
    """The host's call at ``t``: take in the inbox, schedule, launch.
    Returns False (nothing done) when the step log has no room."""
    meta, times, sp = tw.meta, tw.times, tw.speed
    q = meta[M_Q]
    x = plan if q == 0 else tw.plan2
    log_on = tw.params[P_LOG_ON] > 0.0
    if log_on and not _log_room(tw, log, x.slot.size):
        return False
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
        share = tw.params[P_HOST_SHARE]
        whole = plan_time(model, st.req, x, n)
        typical = whole * (1.0 - share)  # the device's part (all of it at share 0)
        prep = whole * share * model.mult  # the host's input preparation before the launch, expected
        if tw.params[P_NOISE_ON] > 0.0:
            dur = typical * noisy_ratio(model.noise, model.stall_q, model.stall_v, tw.rng)
        else:
            dur = typical * model.mult
        meta[M_STEPS] += 1
    launch = t + intake + prep
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
    """The queued batch becomes the oldest: ``plan2``'s items into ``plan``
    (the views hold ``plan`` as the in-flight batch)."""
    for j in range(n):
        plan.slot[j] = plan2.slot[j]
        plan.tokens[j] = plan2.tokens[j]
        plan.computed[j] = plan2.computed[j]
        plan.rid[j] = plan2.rid[j]
        plan.samples[j] = plan2.samples[j]
        plan.preemptions[j] = plan2.preemptions[j]
    plan.counts[PL_N] = n


@njit(cache=True)
def _apply(st, plan, tw, model, out):
    """The host applies the oldest batch's outputs at ``T_END``."""
    meta, times, sp = tw.meta, tw.times, tw.speed
    t = times[T_END]
    n = meta[M_N]
    complete_step(st, plan, n)
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
def advance_async(t_until, st, plan, tw, model, out, log):
    """``harness.twin.loop.kernel.advance`` for an async instance: every host
    call due at or before ``t_until``. Returns 1 when the step log is full
    (the caller flushes it and calls again), else 0."""
    meta, times = tw.meta, tw.times
    while True:
        busy = meta[M_BUSY]
        if busy == RUNNING and times[T_END] <= t_until:
            _apply(st, plan, tw, model, out)
        elif busy == GAP and times[T_START] <= t_until:
            if not _plan(times[T_START], st, plan, tw, model, out, log):
                return 1
        else:
            return 0
