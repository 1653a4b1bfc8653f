"""The engine twin: a discrete-event simulation of a pool of vLLM instances
driven by a trace's arrivals (docs/concepts/twin.md).

Each instance runs the shared scheduler kernel; each step's true duration
is the profile's typical time times lognormal jitter plus occasional
stalls, drawn from the profile's noise model with a per-instance seed
(``noise=False`` charges the expected time exactly). Requests that arrive
during a step join ``waiting`` at the next step boundary, as in vLLM's sync
engine loop. At each arrival a router chooses the instance from honest
views: each instance's state after its last completed step plus the
in-flight step's start and composition, never its end, and never the true
output lengths of residents. A router that sheds (``routers.base.SHED``,
from a router whose class says ``sheds``) sends the request nowhere: it
never enters an instance, its ``instance_id`` stays null and it has no
first token (``TwinResult.extra["shed"]`` counts them).

The twin writes the same tables as a recorded trace (requests with
instance_id, ttft_s, finish_s, preemptions, finish_reason; the step log:
steps, step_items, preemptions; instances), through ``write_twin_trace``.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import pandas as pd

from estimators.engine.block_ids import RequestHashes
from estimators.engine.config import instances_table
from estimators.engine.layout import FINISH_REASONS
from estimators.plugins import PluginError
from estimators.trace_blocks import request_hashes
from harness.twin.event_queue import EventQueue
from harness.twin.instance import ForkOutcomes, Instance, InstanceSpec, TwinConfig, new_outcomes
from harness.twin.loop import parts as lp
from harness.twin.pools.spec import Pool
from harness.twin.views.fleet import FleetViews, IndexedFleetViews
from routers.base import SHED
from routers.base import Router as TimedRouter
from traces.steplog import StepLog
from traces.store import TraceWriter


class Router(Protocol):
    def __call__(self, i: int, t: float, instances: list[Instance]) -> int: ...


@dataclass
class Events:
    """Per-request outcomes, indexed by position in the trace."""

    out: lp.Outcomes
    instance: np.ndarray

    @classmethod
    def new(cls, n: int) -> Events:
        return cls(new_outcomes(n), np.full(n, -1, dtype=np.int64))


@dataclass
class TwinResult:
    requests: pd.DataFrame
    log: StepLog | None  # steps, step_items, preemptions (None without step recording)
    instances: pd.DataFrame
    sim_end_s: float
    steps_run: int
    extra: dict = field(default_factory=dict)
    instance_index: np.ndarray | None = None  # per request, the index of the instance that served it (-1: shed)

    @property
    def steps(self) -> pd.DataFrame | None:
        return None if self.log is None else self.log.steps

    @property
    def step_items(self) -> pd.DataFrame | None:
        return None if self.log is None else self.log.step_items

    @property
    def preemptions(self) -> pd.DataFrame | None:
        return None if self.log is None else self.log.preemptions


def write_twin_trace(w: TraceWriter, res: TwinResult, requests: pd.DataFrame | None = None,
                     steps: bool = True) -> None:
    """Write a twin result as a trace: requests (``requests`` if given, e.g.
    a served trace with more columns), instances and, when recorded and
    ``steps``, its step log."""
    w.write_table("requests", res.requests if requests is None else requests)
    w.write_table("instances", res.instances)
    if steps and res.log is not None:
        res.log.write(w)

@dataclass
class _Run:
    """One replay's inputs and outputs, shared by the two arrival loops."""

    router: Router
    on_arrival: Callable | None
    views: object  # StaleViews or None
    honest: FleetViews | None  # None: the router is an oracle and sees the live instances
    blind: bool
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    hits: np.ndarray | None
    rid_map: np.ndarray
    ev: Events
    sheds: bool = False  # the router may answer SHED

    def seen(self, insts: list[Instance], refresh: Callable[[], None]):
        """What the router is handed: the stale views, the live instances
        (an oracle) or the honest views, refreshed first (``refresh``)
        unless the router is blind (its views wait for the run's end)."""
        if self.views is not None:
            return self.views.views
        if self.honest is None:
            return insts
        if not self.blind:
            refresh()
        return self.honest

    def route(self, i: int, t: float, seen, n_inst: int) -> int:
        """The router's choice for request ``i``, checked."""
        try:
            j = self.router(i, t, seen)
        except PluginError as e:
            raise e.at_request(self.rid_map[i]) from None
        if type(j) is not int:
            return checked_index(j, n_inst)
        if not 0 <= j < n_inst:
            if j == SHED and self.sheds:
                return SHED
            raise ValueError(f"router returned instance {j} for request {self.rid_map[i]!r}: "
                             f"not in 0..{n_inst - 1}")
        return j

    def place(self, i: int, j: int, t: float, insts: list[Instance], views, queue: EventQueue) -> bool:
        """Send request ``i`` to instance ``j`` through ``queue``
        (``EventQueue.place``; False: it was shed, or its front end refused
        it, and every instance is unchanged)."""
        if j == SHED:
            return False  # ev.instance[i] stays -1: served nowhere
        if views is not None:
            views.dispatched(j, i, int(self.prompt[i]))
        inst = insts[j]
        self.ev.instance[i] = j
        p = int(self.prompt[i])
        if p >= inst.max_model_len:
            self.ev.out.reject_t[i] = t  # vLLM's front end refuses it: no room for one output token
            return False
        queue.place(j, t, i, p, int(self.output[i]), 0 if self.hits is None else int(self.hits[i]), self.ev.out)
        return True


LAZY_MIN = 8  # instances from which the fleet loop is lazy for a resident-count router (``_replay_fleet``)


class Twin:
    """Replays a trace's arrivals on a pool of simulated instances."""

    def __init__(self, specs: list[InstanceSpec], cfg: TwinConfig = TwinConfig(),  # noqa: B008 (frozen)
                 fleet_loop: bool = True, lazy: bool = True):
        """``fleet_loop``: advance the due instances in one compiled call
        and refresh only changed views (``_replay``); False advances them
        one call each and refreshes every view at every arrival, the
        reference the fleet loop's byte identity is tested against.
        ``lazy``: the fleet loop leaves an instance in a steady decode run
        alone until the run ends when the router reads only resident
        counts (False: every step is due; the same results, tested)."""
        if not specs:
            raise ValueError("a twin needs at least one instance")
        self.specs = specs
        self.cfg = cfg
        self.fleet_loop = fleet_loop
        self.lazy = lazy  # residents-only routers: instances in a steady run wait for its end (``_replay_fleet``)

    @classmethod
    def from_pool(cls, pool: Pool, cfg: TwinConfig | None = None) -> Twin:
        cfg = cfg or TwinConfig()
        if cfg.frontend_overhead_s is None:
            cfg = replace(cfg, frontend_overhead_s=pool.frontend_overhead_s)
        return cls([InstanceSpec.from_config(c) for c in pool.instances], cfg)

    def run(self, requests: pd.DataFrame, router: Router, hits: np.ndarray | None = None,
            on_arrival: Callable[[int, float, list[Instance]], None] | None = None, views=None,
            hash_block_tokens: int | None = None, predicted: np.ndarray | None = None) -> TwinResult:
        """Replay ``requests``. With prefix caching, requests name their prompt
        blocks by ``hash_ids`` (one per ``hash_block_tokens`` tokens, the
        trace's meta.json); without ids every block is the request's own.
        ``hits`` gives hits outright to instances without caching. ``views``:
        a ``harness.twin.views.stale.StaleViews`` (routers then see the state
        published at an interval, not the live instances).

        The router is handed each instance's ``HonestView``
        (``harness.twin.views.honest``), never the instance, unless it
        declares itself an oracle (``router.oracle is True``: the
        ``oracle`` router and plug-ins whose entry says so). ``predicted``:
        the output lengths the router was told (``RouteInputs.pred_total``),
        shown as its views' residents' targets. ``on_arrival`` is the
        harness's own probe: it sees the live instances."""
        n = len(requests)
        arrival = requests["arrival_s"].to_numpy(dtype=np.float64)
        if n and (np.isnan(arrival).any() or np.any(np.diff(arrival) < 0)):
            raise ValueError("arrivals must be known and sorted to replay a trace")
        prompt = requests["prompt_tokens"].to_numpy(dtype=np.int64)
        output = np.maximum(requests["output_tokens"].to_numpy(dtype=np.int64), 1)
        ev = Events.new(n)
        watch = getattr(router, "watch_first_tokens", None)
        if callable(watch):  # a router that learns online (routers.learned): first tokens as a gateway sees them
            watch(first_token_feed(ev.out.first_t))
        fork_outcomes = ForkOutcomes(n)
        clock = np.zeros(1, dtype=np.float64)  # "now", shared by the instances and their views
        insts = [Instance(i, s, self.cfg, fork_outcomes, clock) for i, s in enumerate(self.specs)]
        pred = None if predicted is None else np.ascontiguousarray(predicted, dtype=np.int64)
        if pred is not None and pred.shape != (n,):
            raise ValueError(f"predicted lengths: {pred.shape} for {n} requests")
        for inst in insts:
            inst.predicted = pred
        views_cls = IndexedFleetViews if getattr(router, "reads", "views") == "indexed" else FleetViews
        honest = None if getattr(router, "oracle", False) is True else \
            views_cls([inst.view for inst in insts], [sp.model for sp in self.specs], clock)
        blind = getattr(router, "blind", False) is True  # decides without looking: its views need no refresh
        rid_map = requests["request_id"].to_numpy()
        by_block: dict[int, RequestHashes] = {}
        for inst in insts:
            if inst.spec.config.caching:
                b = inst.spec.config.block_size
                if b not in by_block:
                    by_block[b] = request_hashes(requests["hash_ids"].tolist() if "hash_ids" in requests else None,
                                                 prompt, hash_block_tokens, b)
                inst.state = inst.state.with_hashes(by_block[b])
        out = ev.out
        ctx = _Run(router, on_arrival, views, honest, blind, arrival, prompt, output, hits, rid_map, ev,
                   getattr(router, "sheds", False) is True)
        self._replay(ctx, insts, clock, self.fleet_loop, self.lazy)
        for inst in insts:
            inst.advance(np.inf, out)
            inst.flush_log()
        if honest is not None:  # a router that kept its views sees the run's end
            if isinstance(honest, IndexedFleetViews):
                honest.bring = None
            honest.refresh(insts, range(len(insts)))
        else:
            for inst in insts:
                inst.sync_view()
        return self._result(requests, ev, insts)

    @staticmethod
    def _replay(c: _Run, insts: list[Instance], clock: np.ndarray, fleet: bool = True, lazy: bool = True) -> None:
        """The arrivals, advancing only instances with an event due
        (``EventQueue``) and, with ``fleet``, refreshing only the views of
        instances that changed: per-arrival work independent of the pool's
        size but for the instances that have something to do."""
        # a router that reads only the residents (``Router.reads``) gets only those kept current: copying the
        # changed views' request tables was a sixth of a shortest-queue replay at 384 instances; and an
        # instance in a steady decode run (whose resident count cannot change) is left alone until the run
        # ends or it is handed a request (``EventQueue(lazy=True)``): at hundreds of instances nearly every
        # arrival found dozens due, each for one step
        # a router that reads views one at a time (``Router.reads == "indexed"``: the latency-aware and chance
        # rules, whose two-level walk with random ties estimates about one replica per decision) has a view
        # brought to the present when it reads it (``IndexedFleetViews``), and the instances nobody reads are
        # left in their steady runs as for a resident-count router
        reads = getattr(c.router, "reads", "views")
        residents_only = reads == "residents"
        indexed = reads == "indexed" and isinstance(c.honest, IndexedFleetViews)
        # laziness computes a run's step times twice (its end, then its steps): it pays where arrivals come
        # faster than an instance's steps, which a few instances' arrivals do not (3: 12% slower, 24: 1.8x faster)
        lazy = fleet and (residents_only or indexed) and lazy and c.views is None and c.on_arrival is None \
            and len(insts) >= LAZY_MIN
        queue = EventQueue(insts, clock, batch=fleet, lazy=lazy)
        out, views = c.ev.out, c.views
        advance_to = queue.advance_to
        sync = queue.refresh_residents if residents_only else queue.refresh_views
        if not fleet:
            sync = lambda honest: honest.refresh(insts, range(len(insts)))  # noqa: E731
        elif lazy and indexed:
            queue.lend(c.honest, out)
            sync = queue.forget_changed

        def refresh() -> None:
            sync(c.honest)

        for i in range(len(c.arrival)):
            t = c.arrival[i]
            if views is not None:
                views.refresh(t, insts, out, advance_to)
            advance_to(t, out)
            if c.on_arrival is not None:
                c.on_arrival(i, t, insts)
            j = c.route(i, t, c.seen(insts, refresh), len(insts))
            if queue.brought_ns:  # the twin's work (the eager loop runs it before the decision), not the router's
                if isinstance(c.router, TimedRouter):
                    c.router.decision_ns -= queue.brought_ns
                queue.brought_ns = 0
            if c.place(i, j, t, insts, views, queue):
                r = insts[j].rate
                insts[j].view.ewma = (r.level, r.last, r.tau)  # the rest of its view waits for the next decision

    def _result(self, requests: pd.DataFrame, ev: Events, insts: list[Instance]) -> TwinResult:
        ids = np.array([s.instance_id for s in self.specs], dtype=object)
        arrival = requests["arrival_s"].to_numpy(dtype=np.float64)
        o = ev.out
        out = requests.copy(deep=False)  # copy-on-write (pandas 3): the caller's table is never changed, nor copied
        out["instance_id"] = np.where(ev.instance >= 0, ids[np.maximum(ev.instance, 0)], None)
        out["ttft_s"] = o.first_t - arrival + (self.cfg.frontend_overhead_s or 0.0)
        out["finish_s"] = o.finish_t
        out["preemptions"] = o.preempt_n
        if any(s.config.caching for s in self.specs):
            out["cached_tokens"] = np.where(o.cached >= 0, o.cached, np.nan)
        out["finish_reason"] = np.where(np.isfinite(o.finish_t),
                                        np.array(FINISH_REASONS, dtype=object)[o.length_capped], None)
        sim_end = float(np.nanmax(o.finish_t)) if np.isfinite(o.finish_t).any() else 0.0
        rid_map = requests["request_id"].to_numpy()
        logs = [inst.step_log(rid_map) for inst in insts] if self.cfg.record_steps else []
        return TwinResult(
            requests=out,
            log=StepLog.concat([g for g in logs if g is not None]),
            instances=instances_table([s.row_config() for s in self.specs]),
            sim_end_s=sim_end,
            steps_run=sum(int(inst.tw.meta[lp.M_STEPS]) for inst in insts),
            extra={"rejected": int(np.isfinite(o.reject_t).sum()), "shed": int((ev.instance < 0).sum())},
            instance_index=ev.instance,
        )


def first_token_feed(first_t: np.ndarray) -> np.ndarray:
    """A read-only view of the twin's first-token times (NaN until a
    request's first token is out): what a gateway sees stream back. A
    value is written when the step producing it completes, so at an
    arrival it holds only the past; the routers that read it still take
    only those strictly before the arrival (``routers.learned``)."""
    v = first_t.view()
    v.flags.writeable = False
    return v


def checked_index(j, n: int) -> int:
    """A router's answer that is not a plain ``int``: a NumPy integer in
    range is taken; anything else (a bool, a float, NaN, None, a string)
    is a router's bug, refused rather than indexed with."""
    if isinstance(j, np.integer) and 0 <= j < n:
        return int(j)
    raise ValueError(f"router returned {j!r} ({type(j).__name__}): not an instance index in 0..{n - 1}")


def fixed_router(assignment: np.ndarray) -> Router:
    """Send request i to instance ``assignment[i]`` (replaying a recording;
    ``blind``: the twin does not refresh views it never reads); -1 (SHED):
    a request the replay's router shed, shed again."""
    def route(i: int, t: float, insts) -> int:
        return int(assignment[i])

    route.blind = True
    route.sheds = bool((np.asarray(assignment) == SHED).any())
    return route


def shortest_queue_router(i: int, t: float, insts: list[Instance]) -> int:
    """Fewest resident requests (ties: lowest index)."""
    return min(range(len(insts)), key=lambda j: (insts[j].residents, j))

