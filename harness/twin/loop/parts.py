"""The engine twin's loop parts (``harness.twin.loop.kernel``): the
bundles' field layouts, the bundles, the online speed rule and the pieces
of a step (intake, schedule-or-reject, outcomes, the step log). Apart so
the skipping of steady runs (``harness.twin.loop.skip``, ``run_memo``) and
the fleet read the layouts without importing the loop."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from estimators.engine.kernel import drop_unservable_head, schedule_step
from estimators.engine.layout import (
    EV_FINISH,
    EV_FIRST,
    EV_LENGTH,
    F_EVENT,
    F_PREEMPTIONS,
    F_PROMPT,
    F_RID,
    F_STATUS,
    PL_NREJ,
    S_NPREEMPT,
    S_NR,
    S_WN,
    ST_WAITING,
)
from estimators.engine.primitives import release_slot, wait_push_back
from estimators.engine.state import StepPlan
from estimators.timemodel.online_speed import speed_update

# meta (int64) fields; M_SKIPPED: steps advanced by the fast path (``_skip_run``), counted in M_STEPS too
M_BUSY, M_N, M_INBOX_N, M_STEPS, M_LOG_STEPS, M_LOG_ITEMS, M_LOG_PRE, M_SKIPPED = 0, 1, 2, 3, 4, 5, 6, 7
# async scheduling (``harness.twin.loop.kernel``'s async mode): 1 on an async instance; the queued batch's size; batches
# in vLLM's two-deep batch queue (planned, outputs not applied yet)
M_ASYNC, M_N2, M_Q = 8, 9, 10
IDLE, RUNNING, GAP = 0, 1, 2  # async: RUNNING = the host waits for the oldest batch's outputs (due at T_END)
# a steady run left in flight (``kernel._skip_run``): its steps still to come after the one in flight (0: none
# known; any other step resets it) and the decodes' computed-token sums S1, S2 before the first of them
M_RUN_LEFT, M_RUN_S1, M_RUN_S2 = 11, 12, 13
# the steps ahead a run's horizon drew (``harness.twin.loop.run_memo``): how many, their batch size and the
# decodes' computed-token sums before the first
M_AH_N, M_AH_NB, M_AH_S1, M_AH_S2 = 14, 15, 16, 17
NM = 18
# params (float64) fields
P_NOISE_ON, P_LOG_ON, P_INTAKE_REQ, P_INTAKE_TOK = 0, 1, 2, 3  # intake: s per joining request and prompt token
P_SKIP_ON = 4  # advance runs of steady decode steps without the scheduler kernel (``_skip_run``)
P_HOST_SHARE = 5  # async scheduling: the host's share of a step's time (the profile's ``host_share``)
NP_ = 6
# times (float64): in-flight step start (or, between steps, the next schedule) and end (hidden from routers)
T_START, T_END = 0, 1
# async scheduling: the device's start and end of the oldest batch (A) and of the queued one (B), B's
# launch and the last launch (the host's clock: when it was ready for its next call)
T_A0, T_A1, T_B0, T_B1, T_LB, T_LAUNCH = 2, 3, 4, 5, 6, 7
NT = 8
# speed (float64): the running host-speed factor learned from completed steps (estimators.timemodel.online_speed):
# weighted sums of clipped log(actual / the profile's typical), their decay per step, the profile's
# baseline log ratio, the clip, the in-flight step's typical time by the profile, the host's true speed,
# and the factor itself (exp(num / den), 1 before any step)
SP_NUM, SP_DEN, SP_LAM, SP_BASE, SP_CLIP, SP_TYP, SP_HOST, SP_FACTOR = 0, 1, 2, 3, 4, 5, 6, 7
SP_TYP2 = 8  # async scheduling: the queued batch's typical time (SP_TYP is the oldest's)
NSP = 9


class TwinArrays(NamedTuple):
    inbox: np.ndarray  # slots arrived, not yet handed to the scheduler (first meta[M_INBOX_N])
    meta: np.ndarray  # M_*
    times: np.ndarray  # T_*
    params: np.ndarray  # P_*
    rng: np.ndarray  # xoshiro256** state
    speed: np.ndarray  # SP_*
    plan2: StepPlan  # async scheduling: the queued batch (one row on a synchronous instance: never used)
    ahead: np.ndarray  # (AHEAD, 3): a steady run's steps ahead, [start, end, typical] (``run_memo``)
    ahead_rng: np.ndarray  # (AHEAD + 1, 4): the noise stream before each of them (row j + 1: after step j)


class Outcomes(NamedTuple):
    """Per-request outcomes, indexed by the request's position in the trace."""

    first_t: np.ndarray
    finish_t: np.ndarray
    reject_t: np.ndarray
    preempt_n: np.ndarray
    length_capped: np.ndarray  # 1: finished at max_model_len (vLLM's "length")
    cached: np.ndarray  # computed tokens before the first chunk: the prefix-cache hit granted (-1: never run)


class LogBuffers(NamedTuple):
    """The step log: per step [start, end], batch size and preemption
    count; per item [rid, tokens, computed_before, prompt]; per preemption
    the rid (in order)."""

    t: np.ndarray
    n: np.ndarray
    npre: np.ndarray
    items: np.ndarray
    pre: np.ndarray




@njit(cache=True, inline="always")
def _observe_speed(sp, duration):
    """One completed step into the running speed factor (normalised EWMA of
    the clipped log ratio: ``estimators.timemodel.online_speed.speed_update``)."""
    if _observe_sums(sp, duration):
        sp[SP_FACTOR] = np.exp(sp[SP_NUM] / sp[SP_DEN])


@njit(cache=True, inline="always")
def _observe_sums(sp, duration):
    """``_observe_speed`` but the factor: the sums only (a run of steps
    sets the factor once, after its last: nothing reads it in between, and
    it is a function of the sums alone). True if the step counted."""
    if duration > 0.0 and sp[SP_TYP] > 0.0:
        sp[SP_NUM], sp[SP_DEN] = speed_update(sp[SP_LAM], sp[SP_NUM], sp[SP_DEN],
                                              np.log(duration / sp[SP_TYP]) - sp[SP_BASE], sp[SP_CLIP])
        return True
    return False


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
def record_events(st, plan, n, t, out):
    """``record_slot`` for every item of a synchronous step."""
    for j in range(n):
        record_slot(st, plan.slot[j], t, out)


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
    arrived since the last plan join the waiting queue in arrival order.
    Returns their intake time (``estimators.timemodel.intake``), which delays the
    step (sync) or the launch (async)."""
    meta = tw.meta
    intake = 0.0
    for i in range(meta[M_INBOX_N]):
        s = tw.inbox[i]
        st.req[s, F_STATUS] = ST_WAITING
        wait_push_back(st.sc, st.waiting, s)
        intake += tw.params[P_INTAKE_REQ] + tw.params[P_INTAKE_TOK] * st.req[s, F_PROMPT]
    meta[M_INBOX_N] = 0
    return intake


@njit(cache=True)
def schedule_or_reject(st, plan, out, t) -> int:
    """``schedule_step`` into ``plan``; requests it refuses are rejected at
    ``t``, and when nothing runs and the waiting head can never be admitted
    the head is rejected and the scheduler asked again (both loops alike).
    Returns the batch size (0: nothing to run)."""
    while True:
        n = schedule_step(st, plan)
        for r in range(plan.counts[PL_NREJ]):
            s = plan.rejected[r]
            out.reject_t[st.req[s, F_RID]] = t
            release_slot(st, s)
        if n > 0 or st.sc[S_NR] > 0 or st.sc[S_WN] == 0:
            return n
        s = drop_unservable_head(st)
        out.reject_t[st.req[s, F_RID]] = t
        release_slot(st, s)
