"""One simulated vLLM instance of the twin (``Instance``): its scheduler
state, in-flight step, inbox, noise stream, learned host speed and step log,
driven by ``harness.twin.loop.kernel``; the ``HonestView`` it keeps for routers
(``harness.twin.views.honest``: refreshed by ``sync_view`` before each
decision, it holds no reference to the instance, so nothing a router walks
reaches the truth); and, for the oracle router only, a clairvoyant fork of
its true future (``true_first_token``). The pool-wide replay is
``harness.twin.simulation``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from estimators.engine.config import InstanceConfig
from estimators.engine.fastcall import entry_point
from estimators.engine.layout import S_NR, S_WN
from estimators.engine.state import SchedState, StepPlan
from estimators.engine.timing import rng_state
from estimators.snapshot import RateTracker, Snapshot
from estimators.timemodel.kernel_form import time_model
from estimators.timemodel.online_speed import HALF_LIFE_STEPS, baseline_log_ratio
from estimators.timemodel.profile import BatchTimeProfile, load_profile
from estimators.timemodel.step_ratios import CLIP_LOG
from harness.twin.loop import kernel as tk
from harness.twin.loop import parts as lp
from harness.twin.loop import run_memo
from harness.twin.loop.hand_over import take_request, wake
from harness.twin.views.honest import H_STEPS, NH, HonestView, async_host, copy_predicted, honest_scalars
from traces.steplog import StepLog

LOG_STEPS = 1 << 15
LOG_ITEMS = 1 << 20
LOG_PRE = 1 << 14
_NONE = np.zeros(0, dtype=np.int64)  # no predicted lengths: the views' targets are 0


@dataclass(frozen=True)
class InstanceSpec:
    """An instance's configuration with its batch-time profile loaded."""

    config: InstanceConfig
    profile: BatchTimeProfile

    @classmethod
    def from_config(cls, c: InstanceConfig) -> InstanceSpec:
        return cls(c, load_profile(c.profile))

    @property
    def instance_id(self) -> str:
        return self.config.instance_id

    @property
    def model(self) -> str:
        return self.config.model or self.config.instance_id

    @property
    def price_in(self) -> float:
        return self.config.price_in

    @property
    def price_out(self) -> float:
        return self.config.price_out

    def row_config(self) -> InstanceConfig:
        """The configuration as the ``instances`` row records it (the
        profile named even when it was given as an object)."""
        return replace(self.config, model=self.model, profile=self.config.profile or self.profile.name)


@dataclass(frozen=True)
class TwinConfig:
    seed: int = 0
    noise: bool = True
    record_steps: bool = True
    frontend_overhead_s: float | None = None  # added to every TTFT; None = the pool's (0 without a pool)
    skip: bool = True  # exact event skipping in the kernel (``harness.twin.loop.skip``); off: every step scheduled


_ADVANCE = None


def _advance_entry(inst: Instance, out: lp.Outcomes):
    """The compiled ``twin_kernel.advance`` (typed once per process)."""
    global _ADVANCE
    if _ADVANCE is None:
        _ADVANCE = entry_point(tk.advance, 0.0, inst.state, inst.plan, inst.tw, inst.model, out, inst.log)
    return _ADVANCE


class Instance:
    """One simulated instance: scheduler state, in-flight step, inbox, noise
    stream and step log. It is an ``InstanceView`` for the twin's own probes
    (``Twin.run``'s ``on_arrival``) and the oracle; every other router is
    handed its ``view`` (``sync_view``)."""

    def __init__(self, index: int, spec: InstanceSpec, cfg: TwinConfig, fork_outcomes: ForkOutcomes | None = None,
                 clock: np.ndarray | None = None):
        self.index = index
        self.fork_outcomes = fork_outcomes if fork_outcomes is not None else ForkOutcomes(0)
        self.spec = spec
        self.instance_id = spec.instance_id
        self.asynchronous = bool(spec.config.async_scheduling)  # vLLM's batch queue (harness.twin.loop.kernel, async mode)
        self.state = SchedState.new(spec.config, capacity=256)
        cap = self.state.capacity
        self.plan = StepPlan.new(cap)
        # the ground truth: the profile at the host's true speed (estimators keep the profile itself)
        base = time_model(spec.profile)
        hs = spec.config.speed
        self.model = base if hs == 1.0 else base._replace(coef=base.coef * hs, gap=base.gap * hs)
        speed = np.zeros(lp.NSP, dtype=np.float64)
        speed[lp.SP_LAM] = 0.5 ** (1.0 / HALF_LIFE_STEPS)
        speed[lp.SP_BASE] = baseline_log_ratio(spec.profile)
        speed[lp.SP_CLIP] = CLIP_LOG
        speed[lp.SP_HOST] = hs
        speed[lp.SP_FACTOR] = 1.0
        params = np.zeros(lp.NP_, dtype=np.float64)
        params[lp.P_NOISE_ON] = 1.0 if cfg.noise else 0.0
        params[lp.P_LOG_ON] = 1.0 if cfg.record_steps else 0.0
        params[lp.P_SKIP_ON] = 1.0 if cfg.skip else 0.0
        params[lp.P_INTAKE_REQ] = spec.profile.intake.per_request_s * hs  # host work, like the gap
        params[lp.P_INTAKE_TOK] = spec.profile.intake.per_prompt_token_s * hs
        params[lp.P_HOST_SHARE] = spec.profile.host_share  # read by the async loop only
        meta = np.zeros(lp.NM, dtype=np.int64)
        meta[lp.M_ASYNC] = 1 if self.asynchronous else 0
        self.tw = lp.TwinArrays(np.zeros(cap, dtype=np.int64), meta, np.zeros(lp.NT, dtype=np.float64), params,
                                rng_state(int(np.random.SeedSequence([cfg.seed, index]).generate_state(1)[0])),
                                speed, StepPlan.new(cap if self.asynchronous else 1), *run_memo.new_arrays())
        self._h = np.zeros(NH, dtype=np.float64)  # async: the honest scalars SFS reads off the live instance
        k = LOG_STEPS if cfg.record_steps else 1
        self.log = lp.LogBuffers(np.zeros((k, 2), dtype=np.float64), np.zeros(k, dtype=np.int64),
                                 np.zeros(k, dtype=np.int64),
                                 np.zeros((LOG_ITEMS if cfg.record_steps else 1, 4), dtype=np.int64),
                                 np.zeros(LOG_PRE if cfg.record_steps else 1, dtype=np.int64))
        self.meta, self.times = self.tw.meta, self.tw.times  # never replaced (plain attributes: routers read them)
        self.max_model_len = spec.config.max_model_len
        self.log_parts: list[tuple[np.ndarray, ...]] = []
        self.rate = RateTracker()
        # "now" (clock[0]): the twin's present, one array shared by a pool's instances and their views, so
        # time passing touches no instance that nothing happened to (harness.twin.event_queue)
        self._clock = np.zeros(1, dtype=np.float64) if clock is None else clock
        self.view = HonestView(index, self.instance_id, self.max_model_len, self._clock)
        self.predicted: np.ndarray | None = None  # output lengths routers were told (their views' F_TARGET)
        self._view_of: SchedState | None = None  # the state the view's arrays were taken from
        self._shadow = np.zeros((0, 0), dtype=np.int64)  # the view's request table
        self.rows_used = 0  # slots ever handed a request: rows above never changed

    def sync_view(self) -> HonestView:
        """Bring ``view`` to this instance's present: the live scheduler
        arrays (re-taken when the instance grew), a fresh copy of the request
        table with the predicted lengths as targets, and the scalars. The
        expressions are the honest accessors' below, so a router decides the
        same on the view as on the instance."""
        v, st = self.view, self.state
        if self._view_of is not st:
            self._shadow = np.zeros_like(st.req)
            v.state = st._replace(req=self._shadow)
            v.inbox, v.inflight, v.inflight2 = self.tw.inbox, self.plan, self.tw.plan2
            self._view_of = st
        copy_predicted(self._shadow, st.req, _NONE if self.predicted is None else self.predicted, st.req.shape[0])
        honest_scalars(v.h, self.meta, self.times, self.tw.speed, self.model.gap)
        v.res[v.ri] = self.residents
        r = self.rate
        v.ewma = (r.level, r.last, r.tau)  # "now" is the shared clock's
        return v

    @property
    def _now(self) -> float:
        return self._clock[0]

    @_now.setter
    def _now(self, t: float) -> None:
        self._clock[0] = t

    def due(self) -> float:
        """When ``advance`` next has work: the in-flight step's end, the end
        of the gap (the next schedule()), or never (idle). ``advance(t)``
        changes nothing but the clock while ``t`` is before it."""
        busy = self.meta[lp.M_BUSY]
        if busy == lp.RUNNING:
            return float(self.times[lp.T_END])
        if busy == lp.GAP:
            return float(self.times[lp.T_START])
        return np.inf

    # --- honest view for routers and estimators (InstanceView)
    @property
    def inbox(self) -> np.ndarray:
        return self.tw.inbox

    @property
    def n_inbox(self) -> int:
        return int(self.meta[lp.M_INBOX_N])

    @property
    def busy(self) -> bool:
        """A step is in flight (async scheduling: a batch is queued)."""
        if self.asynchronous:
            return bool(self.meta[lp.M_Q] > 0)
        return self.meta[lp.M_BUSY] == lp.RUNNING

    @property
    def idle(self) -> bool:
        return self.meta[lp.M_BUSY] == lp.IDLE

    @property
    def inflight(self) -> StepPlan:
        return self.plan

    @property
    def infl_n(self) -> int:
        return int(self.meta[lp.M_N]) if self.busy else 0

    @property
    def infl_start(self) -> float | None:
        if self.asynchronous:
            return float(self.times[lp.T_A0]) if self.busy else None
        return float(self.times[lp.T_START]) if self.busy else None

    def async_host(self) -> tuple[StepPlan, np.ndarray]:
        """Async scheduling: the queued batch's plan and the host's side
        (``estimators.engine.view``'s ``H_*`` fields), as an honest view has them."""
        honest_scalars(self._h, self.meta, self.times, self.tw.speed, self.model.gap)
        return self.tw.plan2, async_host(self._h)

    @property
    def wake_s(self) -> float | None:
        """Between steps: when the engine finished its last step or woke up."""
        if self.meta[lp.M_BUSY] == lp.GAP:
            return float(self.times[lp.T_START] - self.model.gap)
        return None

    @property
    def arrival_rate(self) -> float:
        return self.rate.rate(self._now)

    @property
    def speed_factor(self) -> float:
        """The host speed learned from the steps completed so far (honest:
        their starts and ends are known; 1 before any step)."""
        return self.tw.speed[lp.SP_FACTOR]

    @property
    def speed_steps(self) -> int:
        """Completed steps (the online factor's evidence)."""
        if self.asynchronous:
            honest_scalars(self._h, self.meta, self.times, self.tw.speed, self.model.gap)
            return int(self._h[H_STEPS])
        return int(self.tw.meta[lp.M_STEPS]) - (1 if self.busy else 0)

    def snapshot(self, t: float) -> Snapshot:
        """The honest view at time ``t`` as a Snapshot (live arrays)."""
        return Snapshot(t, self.instance_id, self.state, self.inbox, self.n_inbox, self.plan, self.infl_n,
                        self.infl_start, self.rate.rate(t), self.wake_s)

    def inbox_slots(self) -> np.ndarray:
        return self.inbox[: self.n_inbox]

    def resident_slots(self) -> np.ndarray:
        st = self.state
        return np.concatenate([st.running_slots(), st.waiting_slots(), self.inbox_slots()])

    def resident_progress(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.state.progress(self.resident_slots())

    @property
    def residents(self) -> int:
        """Requests on the instance: running, waiting and not yet taken in."""
        return int(self.state.sc[S_NR] + self.state.sc[S_WN] + self.meta[lp.M_INBOX_N])

    def cached_prefix_tokens(self, rid: int, prompt: int) -> int:
        """The query's longest cached prefix here, in tokens (read only; an
        engine-side router knows it, llm-d's tracks it through KV events)."""
        return self.state.cached_prefix_tokens(rid, prompt)

    def kv_usage(self) -> float:
        return self.state.kv_usage()

    @property
    def queued(self) -> int:
        return int(self.state.sc[S_WN] + self.meta[lp.M_INBOX_N])

    # --- driving
    def advance(self, t: float, out: lp.Outcomes) -> None:
        self._now = t
        busy, times = self.meta[lp.M_BUSY], self.times
        if busy == lp.IDLE or (busy == lp.RUNNING and times[lp.T_END] > t) or \
                (busy == lp.GAP and times[lp.T_START] > t):
            return  # nothing happens on this instance before t
        run = _advance_entry(self, out)
        while run(t, self.state, self.plan, self.tw, self.model, out, self.log):
            self.flush_log()

    def kick(self, t: float) -> None:
        """An arrival woke an idle instance: it will schedule after the gap (``hand_over.wake``)."""
        wake(self.meta, self.times, self.model.gap, t)

    def add(self, rid: int, prompt: int, output: int, hit: int = 0) -> None:
        """Request ``rid`` into the inbox (``hand_over.take_request``, the
        fleet kernel's hand-over too), the instance grown first if full."""
        st = self.state.with_room()
        if st is not self.state:
            self._grow(st)
        st.check_prompt(rid, prompt)
        slot = int(take_request(st.sc, st.free_slots, st.req, self.tw.inbox, self.meta, rid, prompt, output, hit))
        if slot >= self.rows_used:
            self.rows_used = slot + 1
        self.rate.observe(self._now)

    def true_first_token(self, rid: int, prompt: int, output: int, t: float, until: float) -> float:
        """Clairvoyant, for the ``oracle`` router only (no production router
        can know it): on a fork of this instance's future (``fork``), the
        query ``rid`` added at ``t`` with its true output length, the time of
        its first token if it comes by ``until``, else NaN."""
        f = self.fork()
        f.add(rid, prompt, output)
        if f.idle:
            f.kick(t)
        if not 0 <= rid < self.fork_outcomes.n:
            raise ValueError(f"request {rid} is not one of this run's {self.fork_outcomes.n}")
        out = self.fork_outcomes.get()
        out.first_t[rid] = np.nan
        out.reject_t[rid] = np.nan
        f.advance(until, out)
        return out.first_t[rid]

    def fork(self) -> Instance:
        """A private copy of this instance's future: state, in-flight step
        (its true end included), inbox and noise stream, no step log. Only
        the oracle router uses it (it sees what no production router can)."""
        f = Instance.__new__(Instance)
        f.__dict__.update(self.__dict__)
        f.state = self.state.copy()
        f.plan = StepPlan(*(a.copy() for a in self.plan))
        tw = self.tw
        params = tw.params.copy()
        params[lp.P_LOG_ON] = 0.0
        f.tw = lp.TwinArrays(tw.inbox.copy(), tw.meta.copy(), tw.times.copy(), params, tw.rng.copy(), tw.speed.copy(),
                             StepPlan(*(a.copy() for a in tw.plan2)), tw.ahead.copy(), tw.ahead_rng.copy())
        f._h = self._h.copy()
        f.meta, f.times = f.tw.meta, f.tw.times
        f.rate = RateTracker()
        f.log_parts = []
        f._clock = self._clock.copy()  # the fork's time is its own: advancing it moves no one else's "now"
        f.view, f._view_of = HonestView(self.index, self.instance_id, self.max_model_len, f._clock), None
        return f

    def _grow(self, st: SchedState) -> None:
        cap = st.capacity
        self.state = st
        self.plan = self.plan.grown(cap)
        inbox = np.zeros(cap, dtype=np.int64)
        inbox[: self.tw.inbox.size] = self.tw.inbox
        self.tw = self.tw._replace(inbox=inbox, plan2=self.tw.plan2.grown(cap) if self.asynchronous else self.tw.plan2)

    def flush_log(self) -> None:
        meta = self.meta
        k, m, p = int(meta[lp.M_LOG_STEPS]), int(meta[lp.M_LOG_ITEMS]), int(meta[lp.M_LOG_PRE])
        if k:
            lg = self.log
            self.log_parts.append((lg.t[:k].copy(), lg.n[:k].copy(), lg.items[:m].copy(), lg.npre[:k].copy(),
                                   lg.pre[:p].copy()))
        meta[lp.M_LOG_STEPS] = 0
        meta[lp.M_LOG_ITEMS] = 0
        meta[lp.M_LOG_PRE] = 0

    def step_log(self, rid_map: np.ndarray) -> StepLog | None:
        """This instance's flushed log as a ``StepLog`` (request ids from
        ``rid_map``, indexed by trace position)."""
        if not self.log_parts:
            return None
        t, cnt, items, npre, pre = (np.concatenate([part[i] for part in self.log_parts]) for i in range(5))
        step = np.arange(len(cnt), dtype=np.int64)
        return StepLog.from_items(self.instance_id, step, t[:, 0], t[:, 1], np.repeat(step, cnt),
                                  rid_map[items[:, 0]], items[:, 1], items[:, 2], items[:, 3],
                                  np.repeat(step, npre), rid_map[pre])


def new_outcomes(n: int) -> lp.Outcomes:
    nan = lambda: np.full(n, np.nan)  # noqa: E731
    return lp.Outcomes(nan(), nan(), nan(), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                       np.full(n, -1, dtype=np.int64))


class ForkOutcomes:
    """The outcomes clairvoyant forks write into (``Instance.true_first_token``):
    one set per run of ``n`` requests, shared by its instances, made on first
    use. The kernel only writes outcomes, so what earlier forks left in them
    never changes a fork's result."""

    def __init__(self, n: int):
        self.n = n
        self.out: lp.Outcomes | None = None

    def get(self) -> lp.Outcomes:
        if self.out is None:
            self.out = new_outcomes(self.n)
        return self.out
