"""``HonestView``: what a router is handed for one twin instance.

Why a separate object and not the instance itself: a Python object hides
nothing from code that walks its attributes, and the live ``Instance``
holds the truth (each resident's true output length in
``state.req[:, F_TARGET]``, the in-flight step's true end in its times, the
host's true speed, its noise stream). Routers, built-in or plug-in, are
handed these views instead: they hold references only to arrays that carry
nothing a production router could not know (the scheduler's queues and
counters, the in-flight plan, the inbox, the prefix cache) and a private
copy of the request table whose ``F_TARGET`` column holds the *predicted*
output length the router was told (``RouteInputs.pred_total``), or 0 when
the twin was told none. The scalars (in-flight start, wake-up, arrival
rate, learned speed) are plain numbers.

Before each routing decision the twin refreshes the views of the instances
that changed since the last one (``Instance.sync_view``: one copy of the
request table each; ``harness.twin.views.fleet``); an unchanged instance's
view is already current, since "now" is a clock the views share. Only a router that declares itself an
``oracle`` is handed the live instances (``routers.base.ClairvoyantView``).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from estimators.engine.layout import F_RID, F_TARGET, S_WN
from estimators.engine.state import SchedState, StepPlan
from estimators.engine.view import (  # noqa: F401 (the honest scalars' layout, declared beside InstanceView)
    H_BUSY,
    H_GAP,
    H_IDLE,
    H_INBOX,
    H_INFL_N,
    H_LAUNCH,
    H_LB,
    H_N2,
    H_NEXT,
    H_Q,
    H_SPEED,
    H_START,
    H_STEPS,
    H_WAIT,
    H_WAKE,
    NH,
)
from estimators.snapshot import Snapshot
from harness.twin.loop.parts import (
    GAP,
    IDLE,
    M_ASYNC,
    M_BUSY,
    M_INBOX_N,
    M_N,
    M_N2,
    M_Q,
    M_STEPS,
    RUNNING,
    SP_FACTOR,
    T_A0,
    T_LAUNCH,
    T_LB,
    T_START,
)


@njit(cache=True)
def honest_scalars(h, meta, times, speed, gap):
    """Fill a view's ``h`` from the instance's meta, times and speed arrays:
    the in-flight step's start (never its end), the wake-up, the counts."""
    busy = meta[M_BUSY]
    if meta[M_ASYNC] != 0:
        _async_scalars(h, meta, times, speed, gap)
        return
    running = busy == RUNNING
    h[H_BUSY] = 1.0 if running else 0.0
    h[H_IDLE] = 1.0 if busy == IDLE else 0.0
    h[H_GAP] = 1.0 if busy == GAP else 0.0
    h[H_INBOX] = meta[M_INBOX_N]
    h[H_INFL_N] = meta[M_N] if running else 0
    h[H_START] = times[T_START] if running else 0.0
    h[H_WAKE] = times[T_START] - gap if busy == GAP else 0.0
    h[H_SPEED] = speed[SP_FACTOR]
    h[H_STEPS] = meta[M_STEPS] - (1 if running else 0)


@njit(cache=True)
def _async_scalars(h, meta, times, speed, gap):
    """``honest_scalars`` of an async instance: "in flight" is the oldest
    queued batch (on the device: its start, never its end), and the host's
    own clock (launches, its next call) is known to it."""
    busy = meta[M_BUSY]
    q = meta[M_Q]
    h[H_BUSY] = 1.0 if q > 0 else 0.0
    h[H_IDLE] = 1.0 if busy == IDLE else 0.0
    h[H_GAP] = 1.0 if busy == GAP else 0.0
    h[H_INBOX] = meta[M_INBOX_N]
    h[H_INFL_N] = meta[M_N] if q > 0 else 0
    h[H_START] = times[T_A0] if q > 0 else 0.0
    h[H_WAKE] = times[T_START] - gap if busy == GAP else 0.0
    h[H_SPEED] = speed[SP_FACTOR]
    h[H_STEPS] = meta[M_STEPS] - ((1 if meta[M_N] > 0 else 0) if q > 0 else 0) - \
        ((1 if meta[M_N2] > 0 else 0) if q > 1 else 0)
    h[H_Q] = q
    h[H_WAIT] = 1.0 if busy == RUNNING else 0.0
    h[H_N2] = meta[M_N2] if q > 1 else 0
    h[H_LB] = times[T_LB] if q > 1 else 0.0
    h[H_LAUNCH] = times[T_LAUNCH]
    h[H_NEXT] = times[T_START] if busy == GAP else 0.0


def async_host(h: np.ndarray) -> np.ndarray:
    """The host's side of an async instance as SFS reads it: a copy of its
    honest scalars (``estimators.engine.view``'s ``H_*``)."""
    return h.copy()


@njit(cache=True)
def copy_predicted(dst, src, predicted, rows):
    """``dst[:rows] = src[:rows]`` with ``F_TARGET`` replaced by
    ``predicted[F_RID]`` (0 when ``predicted`` is empty), in one pass.
    Compiled: NumPy's copy into a preallocated table beside the instance's
    own ran 10x slower when the two were 4 KiB apart (cache aliasing), and
    this runs before every decision. ``rows``: the slots ever used (rows
    above were copied once and never change)."""
    m = src.shape[1]
    have = predicted.size > 0
    for i in range(rows):
        for j in range(m):
            dst[i, j] = src[i, j]
        dst[i, F_TARGET] = predicted[src[i, F_RID]] if have else 0


class HonestView:
    """One instance as a router sees it (an ``InstanceView``); see the
    module docstring for what it holds and why."""

    def __init__(self, index: int, instance_id: str, max_model_len: int, clock: np.ndarray | None = None):
        self.index = index
        self.instance_id = instance_id
        self.max_model_len = max_model_len
        self.state: SchedState | None = None  # the live scheduler arrays, with a private, predicted request table
        self.inbox = np.zeros(0, dtype=np.int64)  # slots arrived but not yet taken in (first n_inbox)
        self.inflight: StepPlan | None = None  # the in-flight step's plan (first infl_n items)
        self.inflight2: StepPlan | None = None  # async scheduling: the queued batch's plan (h[H_N2] items)
        # the instance's honest scalars at its last change (H_*; written by Instance.sync_view or, for a
        # fleet, by fleet_kernel.sync_views into one row of the fleet's array): read through the properties
        self.h = np.zeros(NH, dtype=np.float64)
        self.h[H_IDLE] = 1.0
        self.h[H_SPEED] = 1.0
        self.res, self.ri = np.zeros(1, dtype=np.int64), 0  # residents at the last refresh: res[ri]
        self.ewma: tuple = (0.0, None, 1.0)  # the instance's RateTracker (level, last, tau) at its last change
        # the twin's present (clock[0]), shared by the pool's views: time passing needs no view touched
        self.clock = np.zeros(1, dtype=np.float64) if clock is None else clock

    @property
    def busy(self) -> bool:
        """A step is in flight."""
        return bool(self.h[H_BUSY])

    @property
    def idle(self) -> bool:
        return bool(self.h[H_IDLE])

    @property
    def n_inbox(self) -> int:
        return int(self.h[H_INBOX])

    @property
    def infl_n(self) -> int:
        return int(self.h[H_INFL_N])

    @property
    def infl_start(self) -> float | None:
        return float(self.h[H_START]) if self.h[H_BUSY] else None

    @property
    def wake_s(self) -> float | None:
        return float(self.h[H_WAKE]) if self.h[H_GAP] else None

    @property
    def speed_factor(self):
        """The host speed learned from completed steps."""
        return self.h[H_SPEED]

    @property
    def speed_steps(self) -> int:
        return int(self.h[H_STEPS])

    @property
    def rate_state(self) -> tuple:
        """(level, last, tau, now): the instance's RateTracker and the present."""
        return (*self.ewma, self.clock[0])

    @property
    def arrival_rate(self) -> float:
        """EWMA of arrivals, per second (``RateTracker.rate``'s expression, evaluated only when read)."""
        level, last, tau = self.ewma
        now = self.clock[0]
        if last is None:
            return 0.0
        return level * np.exp(-(now - last) / tau) / tau

    @property
    def residents(self) -> int:
        """Requests on the instance: running, waiting and not yet taken in
        (counted at the last refresh, into ``res[ri]``: a fleet's
        ``FleetViews.residents``, or the view's own one-element array)."""
        return int(self.res[self.ri])

    @property
    def queued(self) -> int:
        return int(self.state.sc[S_WN]) + int(self.h[H_INBOX])

    def inbox_slots(self) -> np.ndarray:
        return self.inbox[: self.n_inbox]

    def async_host(self) -> tuple[StepPlan, np.ndarray]:
        """Async scheduling: the queued batch's plan and the host's side (``H_*``)."""
        return self.inflight2, async_host(self.h)

    def resident_slots(self) -> np.ndarray:
        st = self.state
        return np.concatenate([st.running_slots(), st.waiting_slots(), self.inbox_slots()])

    def resident_progress(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.state.progress(self.resident_slots())

    def cached_prefix_tokens(self, rid: int, prompt: int) -> int:
        return self.state.cached_prefix_tokens(rid, prompt)

    def kv_usage(self) -> float:
        return self.state.kv_usage()

    def snapshot(self, t: float) -> Snapshot:
        """This view at time ``t`` as a ``Snapshot`` (live arrays)."""
        return Snapshot(t, self.instance_id, self.state, self.inbox, self.n_inbox, self.inflight, self.infl_n,
                        self.infl_start, self.arrival_rate, self.wake_s)
