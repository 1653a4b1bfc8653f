"""SFS as an estimator: Python wrapper around ``estimators.sfs.kernel`` holding the
profile as a ``TimeModel`` and a scratch copy of the state, sized to the
instance. One entry point, ``estimate(view, query)``, for a rebuilt
``Snapshot`` and a live twin instance alike (both are ``InstanceView``s)."""
from __future__ import annotations

import math

import numpy as np

from estimators.engine.block_overlay import OV_EXACT, new_overlay
from estimators.engine.block_pool import B_FREE_ALL_TO_TAIL, copy_block_cache
from estimators.engine.config import InstanceConfig
from estimators.engine.fastcall import entry_point
from estimators.engine.layout import C_ASYNC, C_MAX_LEN, C_PREFIX, F_PROMPT, PREFIX_OFF, KernelInputError
from estimators.engine.state import SchedState, StepPlan
from estimators.engine.step_loop import SCRATCH_WORDS
from estimators.engine.timing import TimeModel
from estimators.engine.view import H_Q, H_START, InstanceView, Query, first_gap
from estimators.sfs.dist import (
    SCRATCH_COLS,
    SCRATCH_ROWS,
    TTFTDist,
    as_array,
    known_part,
    noise_moments,
    sfs_ttft_dist,
)
from estimators.sfs.kernel import sfs_estimate_async, sfs_estimate_borrowed, sfs_estimate_p
from estimators.timemodel.intake import Intake
from estimators.timemodel.kernel_form import time_model
from estimators.timemodel.profile import BatchTimeProfile

MAX_SIM_STEPS = 1_000_000
SPEED_RESOLUTION = 5e-3  # relative: well below the online speed factor's own noise (~1.5%)
_ENTRIES: dict[str, object] = {}


def _example_state():
    """A two-slot state without the prefix cache, its plan, a time model and its scheduler arrays: the
    argument types the kernels' entry points are typed for."""
    st = SchedState.new(InstanceConfig(prefix_caching=False), capacity=2)
    model = TimeModel(0, np.zeros(4), 1.0, 0.0, np.zeros(4), np.zeros(0), np.zeros(0))
    return st, StepPlan.new(2), model, st.core()


def _entry(kind: str):
    """A compiled kernel's entry point, typed once per process and only when first asked for (a first run
    pays every variant it compiles: a pool without the prefix cache never needs ``"cached"``):

    - ``"cached"`` / ``"core"``: ``sfs_estimate_borrowed`` with a scratch state with / without the
      prefix-cache fields;
    - ``"fused"``: ``sfs_estimate_p`` on the scheduler arrays only (caching off);
    - ``"dist"``: ``sfs_ttft_dist``."""
    run = _ENTRIES.get(kind)
    if run is None:
        z = np.zeros(2)
        if kind == "dist":
            run = entry_point(sfs_ttft_dist, 0.0, 0.0, 0.0, 0, 0.0, 0.0, z, z, 0.0, 0.0, 0.0, True, z)
        else:
            st, plan, model, core = _example_state()
            if kind == "fused":
                run = entry_point(sfs_estimate_p, core, st.free_slots, 0, plan, 0, 0.0, 0.0, st.free_slots, 0, 0,
                                  model, core, plan, 0, np.zeros(0), _loop_scratch(), 0.0, 0.0, 0.0, z, z, 0.0,
                                  np.zeros((SCRATCH_ROWS, SCRATCH_COLS)))
            else:
                run = entry_point(sfs_estimate_borrowed, core, st.free_slots, 0, plan, 0, 0.0, 0.0, st.free_slots,
                                  0, 0, model, st if kind == "cached" else core, plan, 0, np.zeros(0),
                                  _loop_scratch())
        _ENTRIES[kind] = run
    return run


def _loop_scratch() -> np.ndarray:
    """The engine loop's scratch for SFS's kernels (``step_loop.scratch_arrays``)."""
    return np.zeros(SCRATCH_WORDS, dtype=np.int64)


def joining_intake(intake: Intake, view: InstanceView, prompt: int) -> float:
    """Request intake at the boundary where the query joins (with the
    requests already arrived, which join at the same boundary:
    ``estimators.sfs.kernel``): ``estimators.timemodel.intake``. The engine takes them in before
    the query's first step can be scheduled, so every TTFT pays it."""
    if intake.per_request_s == 0.0 and intake.per_prompt_token_s == 0.0:
        return 0.0
    n = view.n_inbox
    tokens = prompt + (int(view.state.req[view.inbox[:n], F_PROMPT].sum()) if n else 0)
    return intake.cost(n + 1, tokens)


def _overlay_for(st: SchedState):
    """An overlay over ``st``'s cache for a scratch state of one slot more,
    remembering hits as long as a request's table."""
    return new_overlay(st.bc.ref.size, slots=st.capacity + 1, hit_blocks=st.table.shape[1])


class SFS:
    """Serving-framework simulation of one instance (docs/concepts/estimators.md)."""

    name = "sfs"

    def __init__(self, profile: BatchTimeProfile, pred_total: np.ndarray, frontend_overhead_s: float = 0.0):
        self.profile = profile
        self.model = time_model(profile)
        self.gap = self.model.gap
        self.pred_total = np.ascontiguousarray(pred_total, dtype=np.int64)
        self.overhead = frontend_overhead_s
        self.intake = profile.intake
        self.cap = -1
        self.last_steps = 0
        self.fallbacks = 0  # estimates rerun on a copy of the prefix cache
        self._pointed = None  # the state the scratch state reads the cache of
        self._core, self._core_of, self._off = None, None, False  # the last state estimated: its scheduler arrays, caching off
        self._run = self._run_core = None  # the kernel for a scratch state with / without the prefix-cache fields
        self._base = self.model
        self._speed = 1.0
        self.last_s1 = self.last_s2 = self._typ0 = 0.0
        self.last_est = np.inf
        self._nm = as_array(noise_moments(self.model))
        self._cv = np.ascontiguousarray(profile.trajectory.common_var, dtype=np.float64)
        # the distribution's scale: each step's mean is mean_ratio x typical (the noise model's mean without one)
        self._scale = profile.trajectory.mean_ratio / self._nm[0] if profile.trajectory.mean_ratio > 0 else 1.0
        self._view: InstanceView | None = None  # the last estimate's view and in-flight elapsed time (for its distribution)
        self._elapsed = 0.0
        self._no_typ = np.zeros(0)
        self._lp = _loop_scratch()
        self._dist = np.zeros(5)
        self._ttft_dist = None  # sfs_ttft_dist's entry, compiled on the first distribution
        self._fused = None  # sfs_estimate_p's entry, compiled on the first estimate_p
        self._buf = np.zeros((SCRATCH_ROWS, SCRATCH_COLS))
        # the state estimate_p last saw, its max length (-1: not fused) and scheduler arrays
        self._fast_of, self._fast_max, self._fast_core = None, -1, None

    @property
    def speed(self) -> float:
        """Host speed factor (``estimators.timemodel.online_speed``): every step's
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
            # noise moments stay: the distribution takes the speed factor as its scale c

    def _scratch(self, st: SchedState) -> None:
        """The scratch state: one row more than ``st``; with prefix caching it
        reads ``st``'s live cache and block table without copying them
        (overlay mode, see ``estimators.sfs.kernel``), so it is re-pointed when the
        instance (or its table, when it grows) changes."""
        if st.capacity + 1 > self.cap:
            c = st.capacity + 1
            self.st2 = SchedState(st.cfg.copy(), np.zeros((c, st.req.shape[1]), dtype=np.int64),
                                  np.zeros_like(st.sc), *(np.zeros(c, dtype=np.int64) for _ in range(3)),
                                  st.table, st.bc, st.hashes, _overlay_for(st))
            self.plan2 = StepPlan.new(c)
            self.plan3 = StepPlan.new(c)  # async scheduling: the second scratch plan
            self.cap = c
            self.st2c = self.st2.core()  # caching off: the kernel on the scheduler arrays only
        if self.st2.bc is not st.bc or self.st2.hashes is not st.hashes or self.st2.table is not st.table:
            ov = self.st2.ov
            if ov.bst.size != st.bc.ref.size or ov.hitb.size < st.table.shape[1] or ov.rng.shape[0] < self.cap:
                ov = _overlay_for(st)
            self.st2 = self.st2._replace(bc=st.bc, hashes=st.hashes, table=st.table, ov=ov)
        self._pointed = st  # (a state is a tuple: another cache or table comes as another state)

    def estimate(self, view: InstanceView, q: Query, typ_out: np.ndarray | None = None, *,
                 copy_cache: bool = False) -> float:
        """Point estimate: each step charged the expected time (the
        distribution's own mean, ``last_dist().mean``, is the steps' mean
        ratio for sums and may differ). ``copy_cache``: simulate on a copy of
        the prefix cache even when the overlay could follow (the reference
        the overlay is tested against); ``typ_out`` receives the simulated
        steps' typical durations (for the brute-force check)."""
        typ = self._no_typ if typ_out is None else typ_out
        if not math.isfinite(q.t):  # the kernel takes times relative to it: a NaN would pass every gate silently
            raise KernelInputError(f"query of request {q.rid}: arrival time {q.t!r} is not finite")
        st = view.state
        self._view = None
        if q.prompt >= st.cfg[C_MAX_LEN]:
            self.last_est, self.last_steps = np.inf, 0
            return np.inf  # the engine's front end refuses it (as the twin does)
        if st.cfg[C_ASYNC] != 0:
            return self._estimate_async(view, q, typ)
        if self._core_of is not st:
            self._core, self._core_of, self._off = st.core(), st, bool(st.cfg[C_PREFIX] == PREFIX_OFF)
        core = self._core
        start = view.infl_start
        elapsed = 0.0 if start is None else q.t - start
        self._view, self._elapsed = view, elapsed
        if self._off and not copy_cache:
            # no cache to read: the scratch state without the prefix-cache bundles (each array of a
            # state is unboxed per call and reference-counted per compiled call that takes it)
            if st.capacity + 1 > self.cap:
                self._scratch(st)
            run = self._run_core
            if run is None:
                run = self._run_core = _entry("core")
            est, steps, self.last_s1, self.last_s2, self._typ0 = run(
                core, view.inbox, view.n_inbox, view.inflight, view.infl_n, elapsed,
                first_gap(q.t, start, view.wake_s, self.model.gap), self.pred_total, q.rid, q.prompt, self.model,
                self.st2c, self.plan2, MAX_SIM_STEPS, typ, self._lp)
            self.last_steps = steps
            # never a negative time (a profile's curvature terms may go negative outside the fitted batches)
            intake = joining_intake(self.intake, view, q.prompt) * self._speed  # host work: scaled like the gap
            self.last_est = max(est + self.overhead + intake, 0.0)
            return self.last_est
        if self._pointed is not st:
            self._scratch(st)
        gap = first_gap(q.t, start, view.wake_s, self.model.gap)
        if self._run is None:
            self._run = _entry("cached")
        # before vLLM 0.24 freed blocks without a hash join the free queue's tail, behind cached ones: the
        # overlay counts evictions on the newer order, so such a release simulates on a copy of the cache
        copy_cache = copy_cache or bool(st.bc.sc[B_FREE_ALL_TO_TAIL])
        if copy_cache:
            steps = -1
        else:
            est, steps, self.last_s1, self.last_s2, self._typ0 = self._run(
                core, view.inbox, view.n_inbox, view.inflight, view.infl_n, elapsed, gap, self.pred_total, q.rid,
                q.prompt, self.model, self.st2, self.plan2, MAX_SIM_STEPS, typ, self._lp)
        if steps < 0:  # the cache overlay could not follow: the same simulation on a copy of the cache
            self.fallbacks += not copy_cache
            exact = self.st2._replace(table=np.concatenate([st.table, np.zeros((1, st.table.shape[1]), np.int64)]),
                                      bc=copy_block_cache(st.bc))
            exact.ov.sc[OV_EXACT] = 1
            try:
                est, steps, self.last_s1, self.last_s2, self._typ0 = self._run(
                    core, view.inbox, view.n_inbox, view.inflight, view.infl_n, elapsed, gap, self.pred_total,
                    q.rid, q.prompt, self.model, exact, self.plan2, MAX_SIM_STEPS, typ, self._lp)
            finally:
                exact.ov.sc[OV_EXACT] = 0
        self.last_steps = steps
        intake = joining_intake(self.intake, view, q.prompt) * self._speed
        self.last_est = max(est + self.overhead + intake, 0.0)  # (as above)
        return self.last_est

    def estimate_p(self, view: InstanceView, rid: int, t: float, prompt: int, slo: float) -> float:
        """``estimate(view, Query(rid, t, prompt))`` then ``p_on_time(slo)``,
        with the same numbers and the same state left behind (``last_est``,
        ``last_dist``), in one compiled call where the instance has neither
        prefix caching nor async scheduling (elsewhere the two calls): the
        chance rule asks this of every replica it walks."""
        st = view.state
        if self._fast_of is not st:  # (a state is a tuple: its arrays, so its capacity and core, are its own)
            cfg = st.cfg
            fast = cfg[C_PREFIX] == PREFIX_OFF and cfg[C_ASYNC] == 0
            if fast and st.capacity + 1 > self.cap:
                self._scratch(st)
            self._fast_of, self._fast_max, self._fast_core = st, int(cfg[C_MAX_LEN]) if fast else -1, st.core()
        if prompt >= self._fast_max or not math.isfinite(t):  # (not fused, refused, or the error estimate raises)
            self.estimate(view, Query(rid, t, prompt))
            return self.p_on_time(slo)
        fused = self._fused
        if fused is None:
            fused = self._fused = _entry("fused")
        start = view.infl_start
        model = self.model
        if start is None:
            elapsed = 0.0
            wake = view.wake_s
            gap = model.gap if wake is None else max(0.0, wake + model.gap - t)  # (first_gap)
        else:
            elapsed, gap = t - start, model.gap
        self._view, self._elapsed = view, elapsed
        intake = self.intake
        intake = (0.0 if intake.per_request_s == 0.0 and intake.per_prompt_token_s == 0.0
                  else joining_intake(intake, view, prompt)) * self._speed  # (as estimate: scaled like the gap)
        self.last_est, self.last_steps, self.last_s1, self.last_s2, self._typ0, p = fused(
            self._fast_core, view.inbox, view.n_inbox, view.inflight, view.infl_n, elapsed, gap, self.pred_total, rid,
            prompt, model, self.st2c, self.plan2, MAX_SIM_STEPS, self._no_typ, self._lp, self.overhead, intake,
            self._speed * self._scale, self._nm, self._cv, slo, self._buf)
        return p

    def _estimate_async(self, view: InstanceView, q: Query, typ: np.ndarray) -> float:
        """``estimate`` on an instance with async scheduling
        (``estimators.sfs.kernel.sfs_estimate_async``): the view must carry the host's
        side (``async_host()``: the queued batch and the host's clock), which
        a snapshot rebuilt from a trace does not. With prefix caching the
        simulation runs on a copy of the cache (the overlay is the
        synchronous SFS's)."""
        get = getattr(view, "async_host", None)
        if get is None:
            raise ValueError(f"instance {view.instance_id}: SFS under async scheduling needs the host's side of the "
                             "instance (a twin instance or its view), not a snapshot")
        pb, ah = get()
        st = view.state
        if self._pointed is not st:
            self._scratch(st)
        if st.cfg[C_PREFIX] == PREFIX_OFF:
            st2, core = self.st2c, st.core()
        else:
            st2 = self.st2._replace(table=np.concatenate([st.table, np.zeros((1, st.table.shape[1]), np.int64)]),
                                    bc=copy_block_cache(st.bc))
            core = st
        intake = joining_intake(self.intake, view, q.prompt) * self._speed
        exact = st2 is not self.st2c  # a copy of the cache: no overlay (``copy_state``)
        if exact:
            st2.ov.sc[OV_EXACT] = 1
        try:
            est, steps, self.last_s1, self.last_s2, self._typ0 = sfs_estimate_async(
                core, view.inbox, view.n_inbox, view.inflight, pb, ah, q.t, intake, self.profile.host_share,
                self.pred_total, q.rid, q.prompt,
                self.model, st2, self.plan2, self.plan3, MAX_SIM_STEPS, typ, self._lp)
        finally:
            if exact:
                st2.ov.sc[OV_EXACT] = 0
        self.last_steps = steps
        self._view, self._elapsed = view, (q.t - ah[H_START] if ah[H_Q] > 0 else 0.0)
        self.last_est = max(est + self.overhead, 0.0)
        return self.last_est

    @property
    def dist_scale(self) -> float:
        """c of ``estimators.sfs.dist``: each step of the distribution takes
        c x typical x the noise ratio (the host speed factor times the
        profile's mean ratio for sums over the noise model's mean)."""
        return self._speed * self._scale

    def _fill_dist(self, slo: float, quantiles: bool) -> np.ndarray:
        """The last estimate's distribution into ``self._dist`` (``estimators.sfs.dist``)."""
        v, m = self._view, self.model
        if v is None:  # refused by the front end: no trajectory
            self._dist[:] = (self.last_est, self.last_est, self.last_est, self.last_est, float(self.last_est <= slo))
            return self._dist
        if self._ttft_dist is None:
            self._ttft_dist = _entry("dist")
        self._ttft_dist(self.last_est, self.last_s1, self.last_s2, self.last_steps, m.mult, self.dist_scale, self._nm,
                        self._cv, self._typ0, self._elapsed, float(slo), quantiles, self._dist)
        return self._dist

    def last_parts(self) -> tuple[float, float, float]:
        """The last estimate's known part (everything but the in-flight
        remainder and the simulated steps' charged times), the in-flight
        step's typical duration (0: none) and its elapsed time: what the
        brute-force check of the distribution draws around."""
        typ0 = self._typ0 if self._view is not None else 0.0
        return known_part(self.last_est, self.last_s1, self.model.mult, typ0, self._elapsed), typ0, self._elapsed

    def last_dist(self, slo: float) -> TTFTDist:
        """The last estimate as a distribution: its mean is the noise model's, not the point estimate."""
        return TTFTDist(*self._fill_dist(slo, True).tolist())

    def p_on_time(self, slo: float) -> float:
        """P(TTFT <= slo) of the last estimate."""
        return float(self._fill_dist(slo, False)[4])

    def estimate_dist(self, view: InstanceView, q: Query, slo: float) -> TTFTDist:
        self.estimate(view, q)
        return self.last_dist(slo)
