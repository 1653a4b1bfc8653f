"""``InstanceView``: what an observer (router, estimator) may read of an
instance at time t, whether it is a live twin instance or a ``Snapshot``
rebuilt from a trace: the state after every step that ended by t, the
in-flight step's start and plan (never its end), the requests that arrived
but have not been handed to the scheduler yet, and the arrival rate it saw.
True output lengths are nobody's: each estimator brings its own prediction.

Estimators have one entry point, ``estimate(view, query)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from estimators.engine.state import SchedState, StepPlan


@dataclass
class Query:
    rid: int  # index of the request in its trace (the twin's and the estimators' request key)
    t: float
    prompt: int


@runtime_checkable
class InstanceView(Protocol):
    instance_id: str
    state: SchedState  # live arrays: estimators copy them
    inbox: np.ndarray  # slots arrived but not yet joined, in arrival order (first n_inbox)
    n_inbox: int
    inflight: StepPlan  # the in-flight step's plan (first infl_n items)
    infl_n: int
    infl_start: float | None  # None when no step is in flight
    wake_s: float | None  # between steps: the engine's last boundary (or wake-up)
    arrival_rate: float  # EWMA of arrivals to this instance, per second

    @property
    def residents(self) -> int: ...

    @property
    def queued(self) -> int: ...

    def resident_slots(self) -> np.ndarray: ...

    def resident_progress(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per resident (``resident_slots`` order): request id, prompt tokens,
        tokens computed, outputs produced (``SchedState.progress``)."""
        ...


# an instance's honest scalars (float64: every count is far below 2**53), what a twin's view holds
# (``harness.twin.views.honest``) and SFS reads of an async instance: busy (a step in flight), idle, between
# steps, arrived requests not yet taken in, the in-flight step's size and start (never its end), the
# wake-up, the learned speed factor and the steps it learned from
H_BUSY, H_IDLE, H_GAP, H_INBOX, H_INFL_N, H_START, H_WAKE, H_SPEED, H_STEPS = range(9)
# async scheduling: batches queued (0-2), the host waiting for the oldest's outputs, the queued batch's size
# and launch, the host's last launch and its next call (in the gap); H_BUSY, H_INFL_N and H_START then
# describe the oldest batch (the one on the device). All of it is the host's own clock or past events.
H_Q, H_WAIT, H_N2, H_LB, H_LAUNCH, H_NEXT = range(9, 15)
NH = 15


def first_gap(t: float, infl_start: float | None, wake_s: float | None, gap: float) -> float:
    """Time until the next schedule() after the in-flight step (or from now):
    a full inter-step gap, or what is left of the current one when the
    engine is between steps (it woke or finished a step at ``wake_s``)."""
    if infl_start is None and wake_s is not None:
        return max(0.0, wake_s + gap - t)
    return gap


def elapsed(view: InstanceView, t: float) -> float:
    """Time since the in-flight step started (0 when idle)."""
    return 0.0 if view.infl_start is None else t - view.infl_start
