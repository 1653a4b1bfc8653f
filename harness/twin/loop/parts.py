"""The engine twin's loop parts (``harness.twin.loop.kernel``): the
bundles and the online speed rule. The bundles' field layouts are the
engine loop's (``estimators.engine.step_loop``, declared there once),
re-exported here so the skipping of steady runs
(``harness.twin.loop.skip``, ``run_memo``) and the fleet read them without
importing the loop."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from estimators.engine.state import StepPlan
from estimators.engine.step_loop import (  # noqa: F401 (the loop's layouts, declared once beside its step)
    GAP,
    IDLE,
    M_AH_N,
    M_AH_NB,
    M_AH_S1,
    M_AH_S2,
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
    P_GAP_WITH_STEP,
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
    T_GAP,
    T_INTAKE,
    T_LAUNCH,
    T_LB,
    T_START,
)
from estimators.timemodel.online_speed import speed_update


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
