"""The engine twin: a discrete-event simulation of a pool of vLLM instances
driven by a trace's arrivals (DESIGN section 3).

Each instance runs the shared scheduler kernel; each step's true duration
is the profile's typical time times lognormal jitter plus occasional
stalls, drawn from the profile's noise model with a per-instance seed
(``noise=False`` charges the expected time exactly). Requests that arrive
during a step join ``waiting`` at the next step boundary, as in vLLM's sync
engine loop. At each arrival a router chooses the instance from honest
views: each instance's state after its last completed step plus the
in-flight step's start and composition, never its end, and never the true
output lengths of residents.

The twin writes the same tables as a recorded trace (requests with
instance_id, ttft_s, finish_s, preemptions; steps; step_items; instances).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import pandas as pd

from estimators.batch_time_kernel import profile_arrays, rng_state
from estimators.profile import BatchTimeProfile, load_profile
from estimators.sched_kernel import new_batch_buffers
from estimators.sched_state import S_CAP, S_NR, S_WN, ST_PENDING, EngineConfig, SchedState
from estimators.snapshot import RateTracker, Snapshot, first_gap
from harness import twin_kernel as tk
from harness.pools import InstanceConfig, Pool
from traces.step_aggregates import AGGREGATE_COLUMNS, step_aggregates

LOG_STEPS = 1 << 15
LOG_ITEMS = 1 << 20


@dataclass(frozen=True)
class InstanceSpec:
    instance_id: str
    engine: EngineConfig
    profile: BatchTimeProfile
    model: str = ""
    gpus: int = 0
    price_in: float = float("nan")
    price_out: float = float("nan")
    profile_ref: str = ""

    @classmethod
    def from_config(cls, c: InstanceConfig) -> InstanceSpec:
        engine = EngineConfig(policy=c.policy, max_num_batched_tokens=c.max_num_batched_tokens,
                              max_num_seqs=c.max_num_seqs, block_size=c.block_size, num_kv_blocks=c.num_kv_blocks,
                              long_prefill_token_threshold=c.long_prefill_token_threshold,
                              chunked_prefill=c.chunked_prefill, max_model_len=c.max_model_len)
        return cls(c.instance_id, engine, load_profile(c.profile), c.model, c.gpus, c.price_in, c.price_out, c.profile)


@dataclass(frozen=True)
class TwinConfig:
    seed: int = 0
    noise: bool = True
    record_steps: bool = True
    frontend_overhead_s: float | None = None  # added to every TTFT; None = the pool's (0 without a pool)


class Instance:
    """One simulated instance: scheduler state, in-flight step, inbox, noise
    stream and step log. Routers read it through the honest accessors."""

    def __init__(self, index: int, spec: InstanceSpec, cfg: TwinConfig):
        self.index = index
        self.spec = spec
        self.state = SchedState.new(spec.engine, capacity=256)
        cap = int(self.state.sc[S_CAP])
        self.out_slot, self.out_tok, self.out_cb, self.rejected = new_batch_buffers(cap)
        self.inbox = np.zeros(cap, dtype=np.int64)
        self.meta = np.zeros(tk.NM, dtype=np.int64)
        form, coef, noise, qs, vs = profile_arrays(spec.profile)
        self.meta[tk.M_FORM] = form
        self.coef, self.noise, self.stall_q, self.stall_v = coef, noise, qs, vs
        self.params = np.zeros(tk.NP_, dtype=np.float64)
        self.params[tk.P_GAP] = spec.profile.step_gap_s
        self.params[tk.P_MULT] = spec.profile.expected_multiplier
        self.params[tk.P_NOISE_ON] = 1.0 if cfg.noise else 0.0
        self.params[tk.P_LOG_ON] = 1.0 if cfg.record_steps else 0.0
        self.times = np.zeros(2, dtype=np.float64)
        self.rng = rng_state(int(np.random.SeedSequence([cfg.seed, index]).generate_state(1)[0]))
        self.log_t = np.zeros((LOG_STEPS if cfg.record_steps else 1, 2), dtype=np.float64)
        self.log_n = np.zeros(LOG_STEPS if cfg.record_steps else 1, dtype=np.int64)
        self.log_items = np.zeros((LOG_ITEMS if cfg.record_steps else 1, 4), dtype=np.int64)
        self.log_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.rate = RateTracker()
        self._now = 0.0

    # --- honest view for routers and estimators
    @property
    def busy(self) -> bool:
        """A step is in flight."""
        return self.meta[tk.M_BUSY] == tk.RUNNING

    @property
    def idle(self) -> bool:
        return self.meta[tk.M_BUSY] == tk.IDLE

    @property
    def inflight_start(self) -> float:
        return float(self.times[tk.T_START])

    def inflight_batch(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = int(self.meta[tk.M_N]) if self.busy else 0
        return self.out_slot[:n], self.out_tok[:n], self.out_cb[:n]

    @property
    def wake_s(self) -> float | None:
        """Between steps: when the engine finished its last step or woke up."""
        return float(self.times[tk.T_START] - self.params[tk.P_GAP]) if self.meta[tk.M_BUSY] == tk.GAP else None

    def snapshot(self, t: float) -> Snapshot:
        """The honest view at time ``t`` (live arrays; estimators copy them)."""
        slots, tok, cb = self.inflight_batch()
        return Snapshot(t, self.spec.instance_id, self.state, self.inbox, int(self.meta[tk.M_INBOX_N]), slots, tok,
                        cb, len(slots), self.inflight_start if self.busy else None, self.rate.rate(t), self.wake_s)

    def timing(self, t: float, gap: float) -> tuple[int, int, float, float]:
        """What SFS needs of the live instance without building a Snapshot:
        (requests not yet taken in, in-flight batch size, time since the
        in-flight step started, time to the next schedule() after it)."""
        busy = self.busy
        start = self.inflight_start if busy else None
        return (int(self.meta[tk.M_INBOX_N]), int(self.meta[tk.M_N]) if busy else 0,
                t - start if busy else 0.0, first_gap(t, start, self.wake_s, gap))

    def inbox_slots(self) -> np.ndarray:
        return self.inbox[: self.meta[tk.M_INBOX_N]]

    @property
    def residents(self) -> int:
        """Requests on the instance: running, waiting and not yet taken in."""
        return int(self.state.sc[S_NR] + self.state.sc[S_WN] + self.meta[tk.M_INBOX_N])

    # --- driving
    def _args(self):
        st = self.state
        return (st.cfg, st.req, st.sc, st.running, st.waiting, st.free_slots, self.inbox, self.meta, self.out_slot,
                self.out_tok, self.out_cb, self.rejected, self.times, self.coef, self.noise, self.stall_q,
                self.stall_v, self.params, self.rng)

    def advance(self, t: float, ev) -> None:
        self._now = t
        state = self.meta[tk.M_BUSY]
        if state == tk.IDLE or (state == tk.RUNNING and self.times[tk.T_END] > t) or \
                (state == tk.GAP and self.times[tk.T_START] > t):
            return  # nothing happens on this instance before t
        while tk.advance(t, *self._args(), ev.first_t, ev.finish_t, ev.reject_t, ev.preempt_n,
                         self.log_t, self.log_n, self.log_items):
            self.flush_log()

    def kick(self, t: float) -> None:
        tk.kick(t, self.meta, self.times, self.params)

    def add(self, rid: int, prompt: int, output: int, hit: int = 0) -> None:
        cap_before = int(self.state.sc[S_CAP])
        slot = self.state.add(rid, prompt, output, hit=hit, status=ST_PENDING)
        cap = int(self.state.sc[S_CAP])
        if cap != cap_before:
            self._grow_buffers(cap)
        self.inbox[self.meta[tk.M_INBOX_N]] = slot
        self.meta[tk.M_INBOX_N] += 1
        self.rate.observe(self._now)

    def _grow_buffers(self, cap: int) -> None:
        out_slot, out_tok, out_cb, rejected = new_batch_buffers(cap)
        n = int(self.meta[tk.M_N])
        out_slot[:n], out_tok[:n], out_cb[:n] = self.out_slot[:n], self.out_tok[:n], self.out_cb[:n]
        inbox = np.zeros(cap, dtype=np.int64)
        inbox[: self.inbox.size] = self.inbox
        self.out_slot, self.out_tok, self.out_cb, self.rejected, self.inbox = out_slot, out_tok, out_cb, rejected, inbox

    def flush_log(self) -> None:
        k, m = int(self.meta[tk.M_LOG_STEPS]), int(self.meta[tk.M_LOG_ITEMS])
        if k:
            self.log_parts.append((self.log_t[:k].copy(), self.log_n[:k].copy(), self.log_items[:m].copy()))
        self.meta[tk.M_LOG_STEPS] = 0
        self.meta[tk.M_LOG_ITEMS] = 0


class Router(Protocol):
    def __call__(self, i: int, t: float, instances: list[Instance]) -> int: ...


@dataclass
class Events:
    """Per-request outcomes, indexed by position in the trace."""

    first_t: np.ndarray
    finish_t: np.ndarray
    reject_t: np.ndarray
    preempt_n: np.ndarray
    instance: np.ndarray

    @classmethod
    def new(cls, n: int) -> Events:
        nan = lambda: np.full(n, np.nan)  # noqa: E731
        return cls(nan(), nan(), nan(), np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64))


@dataclass
class TwinResult:
    requests: pd.DataFrame
    steps: pd.DataFrame | None
    step_items: pd.DataFrame | None
    instances: pd.DataFrame
    sim_end_s: float
    steps_run: int
    extra: dict = field(default_factory=dict)


def instances_table(specs: list[InstanceSpec]) -> pd.DataFrame:
    return pd.DataFrame([{
        "instance_id": s.instance_id, "model": s.model or s.instance_id, "gpus": s.gpus, "policy": s.engine.policy,
        "max_num_batched_tokens": s.engine.max_num_batched_tokens, "max_num_seqs": s.engine.max_num_seqs,
        "block_size": s.engine.block_size, "num_kv_blocks": s.engine.num_kv_blocks, "price_in": s.price_in,
        "price_out": s.price_out, "profile": s.profile_ref or s.profile.name,
        "long_prefill_token_threshold": s.engine.long_prefill_token_threshold,
        "max_model_len": s.engine.max_model_len, "chunked_prefill": s.engine.chunked_prefill,
    } for s in specs])


class Twin:
    """Replays a trace's arrivals on a pool of simulated instances."""

    def __init__(self, specs: list[InstanceSpec], cfg: TwinConfig = TwinConfig()):
        if not specs:
            raise ValueError("a twin needs at least one instance")
        self.specs = specs
        self.cfg = cfg

    @classmethod
    def from_pool(cls, pool: Pool, cfg: TwinConfig | None = None) -> Twin:
        cfg = cfg or TwinConfig()
        if cfg.frontend_overhead_s is None:
            cfg = replace(cfg, frontend_overhead_s=pool.frontend_overhead_s)
        return cls([InstanceSpec.from_config(c) for c in pool.instances], cfg)

    def run(self, requests: pd.DataFrame, router: Router, hits: np.ndarray | None = None,
            on_arrival: Callable[[int, float, list[Instance]], None] | None = None) -> TwinResult:
        n = len(requests)
        arrival = requests["arrival_s"].to_numpy(dtype=np.float64)
        if n and (np.isnan(arrival).any() or np.any(np.diff(arrival) < 0)):
            raise ValueError("arrivals must be known and sorted to replay a trace")
        prompt = requests["prompt_tokens"].to_numpy(dtype=np.int64)
        output = np.maximum(requests["output_tokens"].to_numpy(dtype=np.int64), 1)
        ev = Events.new(n)
        insts = [Instance(i, s, self.cfg) for i, s in enumerate(self.specs)]
        for i in range(n):
            t = arrival[i]
            for inst in insts:
                inst.advance(t, ev)
            if on_arrival is not None:
                on_arrival(i, t, insts)
            j = router(i, t, insts)
            inst = insts[j]
            ev.instance[i] = j
            inst.add(i, int(prompt[i]), int(output[i]), 0 if hits is None else int(hits[i]))
            if inst.idle:
                inst.kick(t)
        for inst in insts:
            inst.advance(np.inf, ev)
            inst.flush_log()
        return self._result(requests, ev, insts)

    def _result(self, requests: pd.DataFrame, ev: Events, insts: list[Instance]) -> TwinResult:
        ids = np.array([s.instance_id for s in self.specs], dtype=object)
        arrival = requests["arrival_s"].to_numpy(dtype=np.float64)
        out = requests.copy()
        out["instance_id"] = np.where(ev.instance >= 0, ids[np.maximum(ev.instance, 0)], None)
        out["ttft_s"] = ev.first_t - arrival + (self.cfg.frontend_overhead_s or 0.0)
        out["finish_s"] = ev.finish_t
        out["preemptions"] = ev.preempt_n
        steps_frames, item_frames = [], []
        steps_run = 0
        sim_end = float(np.nanmax(ev.finish_t)) if np.isfinite(ev.finish_t).any() else 0.0
        rid_map = requests["request_id"].to_numpy()
        for inst in insts:
            steps_run += int(inst.meta[tk.M_STEPS])
            if not self.cfg.record_steps or not inst.log_parts:
                continue
            t = np.concatenate([p[0] for p in inst.log_parts])
            cnt = np.concatenate([p[1] for p in inst.log_parts])
            items = np.concatenate([p[2] for p in inst.log_parts])
            step_idx = np.repeat(np.arange(len(cnt), dtype=np.int64), cnt)
            item_df = pd.DataFrame({"instance_id": inst.spec.instance_id, "step": step_idx,
                                    "request_id": rid_map[items[:, 0]], "tokens": items[:, 1],
                                    "computed_before": items[:, 2], "prompt_tokens": items[:, 3]})
            agg = step_aggregates(item_df)
            steps_df = pd.DataFrame({"instance_id": inst.spec.instance_id, "step": np.arange(len(cnt), dtype=np.int64),
                                     "start_s": t[:, 0], "end_s": t[:, 1]})
            steps_df = steps_df.merge(agg, on=["instance_id", "step"], how="left")
            steps_df[list(AGGREGATE_COLUMNS)] = steps_df[list(AGGREGATE_COLUMNS)].fillna(0).astype(np.int64)
            steps_df["num_preempted"] = 0
            steps_frames.append(steps_df)
            item_frames.append(item_df)
        return TwinResult(
            requests=out,
            steps=pd.concat(steps_frames, ignore_index=True) if steps_frames else None,
            step_items=pd.concat(item_frames, ignore_index=True) if item_frames else None,
            instances=instances_table(self.specs),
            sim_end_s=sim_end,
            steps_run=steps_run,
            extra={"rejected": int(np.isfinite(ev.reject_t).sum())},
        )


def fixed_router(assignment: np.ndarray) -> Router:
    """Send request i to instance ``assignment[i]`` (replaying a recording)."""
    return lambda i, t, insts: int(assignment[i])


def round_robin_router() -> Router:
    state = {"next": 0}

    def route(i: int, t: float, insts: list[Instance]) -> int:
        j = state["next"] % len(insts)
        state["next"] += 1
        return j

    return route


def shortest_queue_router(i: int, t: float, insts: list[Instance]) -> int:
    """Fewest resident requests (ties: lowest index)."""
    return min(range(len(insts)), key=lambda j: (insts[j].residents, j))

