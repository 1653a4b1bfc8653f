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


# async scheduling: the host's side of an instance, as SFS follows it (``estimators.sfs.async_kernel``),
# float64: batches queued (0-2), the host waiting for the oldest's outputs, the host between calls (its
# next call at AH_NEXT), the oldest batch's size and device start, the queued batch's size and launch,
# the host's last launch. All of it is the host's own clock or past events: never a batch's end.
AH_Q, AH_WAIT, AH_GAP, AH_NA, AH_START_A, AH_NB, AH_LAUNCH_B, AH_LAUNCH, AH_NEXT = range(9)
NAH = 9


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
