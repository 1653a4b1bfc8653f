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
request table each; ``harness.twin.fleet_views``); an unchanged instance's
view is already current, since "now" is a clock the views share. Only a router that declares itself an
``oracle`` is handed the live instances (``routers.base.ClairvoyantView``).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from estimators.engine.layout import F_RID, F_TARGET, S_NR, S_WN
from estimators.engine.state import SchedState, StepPlan
from estimators.snapshot import Snapshot


@njit(cache=True)
def copy_predicted(dst, src, predicted):
    """``dst[:] = src`` with ``F_TARGET`` replaced by ``predicted[F_RID]`` (0
    when ``predicted`` is empty), in one pass. Compiled: NumPy's copy into a
    preallocated table beside the instance's own ran 10x slower when the two
    were 4 KiB apart (cache aliasing), and this runs before every decision."""
    n, m = src.shape
    have = predicted.size > 0
    for i in range(n):
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
        self.n_inbox = 0
        self.infl_n = 0
        self.infl_start: float | None = None
        self.wake_s: float | None = None
        self.ewma: tuple = (0.0, None, 1.0)  # the instance's RateTracker (level, last, tau) at its last change
        # the twin's present (clock[0]), shared by the pool's views: time passing needs no view touched
        self.clock = np.zeros(1, dtype=np.float64) if clock is None else clock
        self.speed_factor = 1.0  # the host speed learned from completed steps
        self.speed_steps = 0
        self.busy = False
        self.idle = True

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
        """Requests on the instance: running, waiting and not yet taken in."""
        sc = self.state.sc
        return int(sc[S_NR] + sc[S_WN]) + self.n_inbox

    @property
    def queued(self) -> int:
        return int(self.state.sc[S_WN]) + self.n_inbox

    def inbox_slots(self) -> np.ndarray:
        return self.inbox[: self.n_inbox]

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
