"""SFS as an estimator: Python wrapper around ``sfs_kernel`` holding the
profile as a ``TimeModel`` and a scratch copy of the state, sized to the
instance. One entry point, ``estimate(view, query)``, for a rebuilt
``Snapshot`` and a live twin instance alike (both are ``InstanceView``s)."""
from __future__ import annotations

import numpy as np

from estimators.engine.config import InstanceConfig
from estimators.engine.fastcall import entry_point
from estimators.engine.layout import C_MAX_LEN
from estimators.engine.state import SchedState, StepPlan
from estimators.engine.timing import TimeModel
from estimators.engine.view import InstanceView, Query, first_gap
from estimators.profile import BatchTimeProfile
from estimators.sfs_dist import TTFTDist, as_array, noise_moments, ttft_dist
from estimators.sfs_kernel import sfs_estimate

MAX_SIM_STEPS = 1_000_000
SPEED_RESOLUTION = 5e-3  # relative: well below the online speed factor's own noise (~1.5%)
_ENTRY = None
_DIST = None


def _dist_entry():
    """``ttft_dist``'s compiled entry point (typed once per process)."""
    global _DIST
    if _DIST is None:
        _DIST = entry_point(ttft_dist, 0.0, 0.0, 0.0, 0, 0.0, np.zeros(6), 0.0, True, np.zeros(5))
    return _DIST


def _entry():
    """The compiled kernel's entry point (typed once per process)."""
    global _ENTRY
    if _ENTRY is None:
        st = SchedState.new(InstanceConfig(), capacity=2)
        plan = StepPlan.new(2)
        model = TimeModel(0, np.zeros(4), 1.0, 0.0, np.zeros(4), np.zeros(0), np.zeros(0))
        _ENTRY = entry_point(sfs_estimate, st, st.free_slots, 0, plan, 0, 0.0, 0.0, st.free_slots, 0, 0, model,
                             st, plan, 0, np.zeros(0))
    return _ENTRY


class SFS:
    """Serving-framework simulation of one instance (DESIGN section 2)."""

    name = "sfs"

    def __init__(self, profile: BatchTimeProfile, pred_total: np.ndarray, frontend_overhead_s: float = 0.0):
        self.profile = profile
        self.model = TimeModel.of(profile)
        self.gap = self.model.gap
        self.pred_total = np.ascontiguousarray(pred_total, dtype=np.int64)
        self.overhead = frontend_overhead_s
        self.cap = -1
        self.last_steps = 0
        self._run = _entry()
        self._base = self.model
        self._speed = 1.0
        self.last_s1 = self.last_s2 = 0.0
        self.last_est = np.inf
        self._nm = as_array(noise_moments(self.model))
        self._no_typ = np.zeros(0)
        self._dist = np.zeros(5)
        self._ttft_dist = _dist_entry()

    @property
    def speed(self) -> float:
        """Host speed factor (``estimators.online_speed``): every step's
        expected time and the gap between steps are scaled by it."""
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        # changes under SPEED_RESOLUTION are ignored: the learned factor moves a little with every step, and
        # rebuilding the TimeModel (~3 us) at every estimate would cost more than the correction is worth
        if abs(value - self._speed) > SPEED_RESOLUTION * self._speed:
            self._speed = value
            b = self._base
            self.model = TimeModel(b.form, b.coef, b.mult * value, b.gap * value, b.noise, b.stall_q, b.stall_v)
            # noise moments stay: c = mult / E[r] carries the speed into the spread

    def _scratch(self, st: SchedState) -> None:
        if st.capacity + 1 > self.cap:
            c = st.capacity + 1
            self.st2 = SchedState(st.cfg.copy(), np.zeros((c, st.req.shape[1]), dtype=np.int64),
                                  np.zeros_like(st.sc), *(np.zeros(c, dtype=np.int64) for _ in range(3)))
            self.plan2 = StepPlan.new(c)
            self.cap = c

    def estimate(self, view: InstanceView, q: Query, typ_out: np.ndarray | None = None) -> float:
        """Point estimate (the mean); ``typ_out`` receives the simulated
        steps' typical durations (for the brute-force check)."""
        st = view.state
        if q.prompt >= st.cfg[C_MAX_LEN]:
            return np.inf  # the engine's front end refuses it (as the twin does)
        self._scratch(st)
        start = view.infl_start
        elapsed = 0.0 if start is None else q.t - start
        est, steps, self.last_s1, self.last_s2 = self._run(
            st, view.inbox, view.n_inbox, view.inflight, view.infl_n, elapsed,
            first_gap(q.t, start, view.wake_s, self.model.gap), self.pred_total, q.rid, q.prompt, self.model, self.st2,
            self.plan2, MAX_SIM_STEPS, self._no_typ if typ_out is None else typ_out)
        self.last_steps = steps
        self.last_est = est + self.overhead
        return self.last_est

    def last_dist(self, slo: float) -> TTFTDist:
        """The last estimate as a distribution (``estimators.sfs_dist``)."""
        self._ttft_dist(self.last_est, self.last_s1, self.last_s2, self.last_steps, self.model.mult, self._nm,
                        float(slo), True, self._dist)
        d = self._dist
        return TTFTDist(d[0], d[1], d[2], d[3], d[4])

    def p_on_time(self, slo: float) -> float:
        """P(TTFT <= slo) of the last estimate."""
        self._ttft_dist(self.last_est, self.last_s1, self.last_s2, self.last_steps, self.model.mult, self._nm,
                        float(slo), False, self._dist)
        return float(self._dist[4])

    def estimate_dist(self, view: InstanceView, q: Query, slo: float) -> TTFTDist:
        self.estimate(view, q)
        return self.last_dist(slo)
