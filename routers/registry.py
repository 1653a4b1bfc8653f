"""The router registry: every router's name, what it needs and how to build it.

The CLI, sweeps, the demo and the results learn what a router needs from its
entry, never from its name: whether it asks a TTFT estimator (and which),
whether the soft rule's delta or the cost weight lambda change its
decisions, whether its estimator needs request-level baseline parameters
(measured on a calibration replay of the pool), and whether it is an
*oracle* (sees something a production router cannot, e.g. true output
lengths, or the ``oracle`` router's fork of the twin's future). Sweeps and replays copy
``capabilities()`` of the routers they ran into metrics.json, so reports
read them from the result, not from this module.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from estimators import plugins
from estimators.estimate import ESTIMATORS, BaselineParams, build
from estimators.plugins import PluginError
from routers.base import RouteInputs, Router
from routers.chance import DEFAULT_EPSILON, ChanceRouter, LognormalError
from routers.fleet import DEFAULT_TIES, check_ties
from routers.foreign import IsolatedRouter, PluginRouter
from routers.latency_aware import LatencyAware
from routers.prefix_affinity import PrefixAffinity, PrefixLoad
from routers.simple import LatencyAgnostic, LeastTokens, PowerOfTwo, RoundRobin, ShortestQueue


@dataclass(frozen=True)
class BuildContext:
    """Everything a router may be built from (all honest)."""

    inputs: RouteInputs
    specs: list  # harness.twin.simulation.InstanceSpec per instance
    frontend_overhead_s: float
    delta_per_us: float = 0.0
    seed: int = 0
    baselines: dict[str, BaselineParams] | None = None
    online_speed: bool = False  # estimators scale their profile by each instance's learned host speed
    epsilon: float = DEFAULT_EPSILON  # chance-constrained routers: allowed P(late)
    true_outputs: object = None  # true output lengths: given to oracle routers only
    ties: str = DEFAULT_TIES  # two-level routers: the replica among a model's (routers.fleet)
    learned: object = None  # learned routers: their estimators.learned.model.LearnedConfig (None: its defaults)


@dataclass(frozen=True)
class RouterEntry:
    name: str
    summary: str
    make: Callable[[BuildContext], Router]
    estimator: str | None = None  # TTFT estimator it asks, per instance
    rule: str | None = None  # hard | soft (latency-aware routers)
    uses_delta: bool = False  # the soft rule's delta changes its decisions
    uses_lambda: bool = False  # decides on predicted utility, so lambda changes its decisions
    needs_baselines: bool = False  # its estimator needs the pool's baseline parameters
    oracle: bool = False  # sees what a production router cannot
    uses_epsilon: bool = False  # the chance constraint's epsilon changes its decisions
    seeded: bool = False  # draws random numbers (from the replay's seed)
    sheds: bool = False  # may decline a request (routers.base.SHED): utility 0 and an SLO miss
    baseline: bool = False  # a baseline that latency-aware routers are compared against
    main: bool = False  # in the default sweep

    @property
    def needs_estimator(self) -> bool:
        return self.estimator is not None

    def capabilities(self) -> dict:
        """The JSON block results carry per router."""
        caps = {"estimator": self.estimator, "rule": self.rule, "uses_delta": self.uses_delta,
                "uses_lambda": self.uses_lambda, "needs_baselines": self.needs_baselines, "oracle": self.oracle,
                "uses_epsilon": self.uses_epsilon, "seeded": self.seeded, "baseline": self.baseline}
        if self.sheds:  # only where true: the results of routers that never shed keep the keys they always had
            caps["sheds"] = True
        return caps


def _models(c: BuildContext) -> list[str]:
    """Each instance's model: instances sharing one are replicas (``routers.fleet``)."""
    return [str(getattr(s, "model", None) or getattr(s, "instance_id", k)) for k, s in enumerate(c.specs)]


def _latency_aware(estimator: str, rule: str) -> Callable[[BuildContext], Router]:
    def make(c: BuildContext) -> Router:
        ests = [build(estimator, s.profile, (c.baselines or {}).get(s.instance_id), c.inputs.pred_total,
                      c.frontend_overhead_s, online_lps=True) for s in c.specs]
        return LatencyAware(c.inputs, ests, rule, c.delta_per_us if rule == "soft" else 0.0,
                            name=f"{estimator}-{rule}", online_speed=c.online_speed, models=_models(c),
                            ties=c.ties, seed=c.seed)
    return make


def _chance(estimator: str, rule: str) -> Callable[[BuildContext], Router]:
    def make(c: BuildContext) -> Router:
        ests = []
        for s in c.specs:
            params = (c.baselines or {}).get(s.instance_id)
            est = build(estimator, s.profile, params, c.inputs.pred_total, c.frontend_overhead_s, online_lps=True)
            if estimator != "sfs":
                est = LognormalError(est, params.err_log_mu, params.err_log_sigma)
            ests.append(est)
        return ChanceRouter(c.inputs, ests, rule, c.epsilon, name=f"{estimator}-{rule}", models=_models(c),
                            ties=c.ties, seed=c.seed)
    return make


def _learned(kind: str) -> Callable[[BuildContext], Router]:
    """A learned router: one online model per model of the pool (its
    replicas share it, as llm-d trains one per pool), each instance's
    estimator asking it, the throughput baseline as its cold start.
    Imported when built: ``latroute --help`` loads neither these modules'
    rules nor LightGBM (which only the first fit imports)."""
    def make(c: BuildContext) -> Router:
        from estimators.learned.trainer import OnlineTrainer
        from routers.learned import LearnedCC, LearnedHard
        from routers.llmd import LlmdHeadroom
        from routers.llmd_admit import LlmdAdmit

        models = _models(c)
        trainers = {m: OnlineTrainer(c.learned) for m in dict.fromkeys(models)}
        ests = [build("learned", s.profile, (c.baselines or {}).get(s.instance_id), c.inputs.pred_total,
                      c.frontend_overhead_s, trainer=trainers[m]) for s, m in zip(c.specs, models)]
        if kind == "hard":
            return LearnedHard(c.inputs, ests, c.frontend_overhead_s, online_speed=c.online_speed, models=models,
                               ties=c.ties, seed=c.seed)
        if kind == "cc":
            return LearnedCC(c.inputs, ests, c.epsilon, c.frontend_overhead_s, models=models, ties=c.ties,
                             seed=c.seed)
        if kind == "admit":
            return LlmdAdmit(c.inputs, ests, models, c.seed, overhead_s=c.frontend_overhead_s)
        return LlmdHeadroom(c.inputs, ests, models, c.seed, overhead_s=c.frontend_overhead_s)
    return make


def _oracle(c: BuildContext) -> Router:
    from routers.oracle import Oracle  # the twin's fork: imported only when asked

    if c.true_outputs is None:
        raise ValueError("the oracle router needs the requests' true output lengths")
    return Oracle(c.inputs, c.true_outputs, c.frontend_overhead_s)


# estimator -> whether it needs the pool's baseline parameters (SFS needs only the batch-time profile)
ESTIMATOR_NEEDS_BASELINES = {"sfs": False, "throughput": True, "lps": True, "lps-mg": True, "queue": True,
                             "learned": True}  # learned: its cold start is the throughput baseline

_ENTRIES = [
    RouterEntry("round-robin", "instances in turn", lambda c: RoundRobin(c.inputs), baseline=True),
    RouterEntry("shortest-queue", "fewest resident requests", lambda c: ShortestQueue(c.inputs), baseline=True,
                main=True),
    RouterEntry("least-tokens", "fewest outstanding tokens (predicted decode lengths)",
                lambda c: LeastTokens(c.inputs)),
    RouterEntry("power-of-two", "the shorter queue of two random instances",
                lambda c: PowerOfTwo(c.inputs, c.seed), seeded=True),
    RouterEntry("prefix-affinity", "longest cached prefix, ties by fewest residents (llm-d's prefix scorer)",
                lambda c: PrefixAffinity(c.inputs)),
    RouterEntry("prefix-load", "weighted prefix + queue + KV score (llm-d's scorers, weights 3/2/2)",
                lambda c: PrefixLoad(c.inputs)),
    RouterEntry("latency-agnostic", "highest predicted utility, latency ignored",
                lambda c: LatencyAgnostic(c.inputs), uses_lambda=True, baseline=True, main=True),
] + [
    RouterEntry(f"{est}-{rule}",
                f"{est} TTFT estimate per instance, " + ("best utility meeting the SLO" if rule == "hard"
                                                          else "max utility - delta * estimated TTFT"),
                _latency_aware(est, rule), estimator=est, rule=rule, uses_delta=rule == "soft", uses_lambda=True,
                needs_baselines=ESTIMATOR_NEEDS_BASELINES[est], main=est == "sfs")
    for est in ESTIMATORS for rule in ("hard", "soft")
] + [
    RouterEntry(f"{est}-{rule}",
                f"{est} TTFT distribution per instance, " + (
                    "best utility with P(on time) >= 1 - epsilon, else the likeliest on time" if rule == "cc"
                    else "max utility x P(on time)"),
                _chance(est, rule), estimator=est, rule=rule, uses_lambda=True, uses_epsilon=rule == "cc",
                needs_baselines=ESTIMATOR_NEEDS_BASELINES[est], main=est == "sfs")
    for est in ("sfs", "throughput") for rule in ("cc", "eu")
] + [
    RouterEntry("oracle", "clairvoyant: forks each instance's future (noise and true lengths included, later "
                "arrivals not routed yet) and picks the best on-time utility", _oracle, uses_lambda=True,
                oracle=True),
] + [  # after the oracle: the report palette keeps every earlier router's colour
    RouterEntry("learned-hard", "llm-d's online-trained LightGBM TTFT model (mean) per instance, best utility "
                "meeting the SLO (throughput baseline until trained; learned extra)", _learned("hard"),
                estimator="learned", rule="hard", uses_lambda=True, needs_baselines=True),
    RouterEntry("learned-cc", "the learned model's p50/p90 per instance, best utility with P(on time) >= "
                "1 - epsilon, else the likeliest on time (learned extra)", _learned("cc"), estimator="learned",
                rule="cc", uses_lambda=True, uses_epsilon=True, needs_baselines=True),
    RouterEntry("llmd-headroom", "llm-d's SLO-aware profile: models by utility, then its headroom tier filter "
                "(SLO - learned p90; 1% exploration) and latency scorer over the replicas (learned extra)",
                _learned("headroom"), estimator="learned", rule="headroom", uses_lambda=True, seeded=True,
                needs_baselines=True),
    RouterEntry("llmd-admit", "llmd-headroom behind llm-d's latency-slo-admitter: sheds a request (utility 0, "
                "an SLO miss) when no instance of the pool has learned p90 within its SLO, none is idle and none "
                "cold (KV < 2%); fail-open while no model is trained (learned extra)", _learned("admit"),
                estimator="learned", rule="headroom", uses_lambda=True, seeded=True, needs_baselines=True,
                sheds=True),
]

REGISTRY: dict[str, RouterEntry] = {e.name: e for e in _ENTRIES}
ROUTERS = list(REGISTRY)
BASELINE_ROUTERS = tuple(n for n, e in REGISTRY.items() if e.baseline)
MAIN_ROUTERS = tuple(n for n, e in REGISTRY.items() if e.main)


def router_entry(name: str) -> RouterEntry:
    """A built-in router by name, or a plug-in by import path ``module:attr``."""
    if ":" in name:
        return plugin_entry(name)
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r} (choose from {', '.join(ROUTERS)}, or module:Class)") from None


def plugin_entry(path: str) -> RouterEntry:
    """The registry entry of a plug-in router named by import path.

    ``module:attr`` names either a ``RouterEntry`` (full control: what it
    needs, how it is built) or a ``routers.base.Router`` subclass, built as
    ``cls(inputs)`` and described by its class attributes ``summary``,
    ``uses_delta``, ``uses_lambda``, ``seeded`` and ``oracle`` (all
    optional; a seeded class is built as ``cls(inputs, seed)``). A plug-in
    sees what built-in routers see, nothing more (``routers.base``), and is
    foreign code: the entry builds it behind a guard (``routers.foreign``),
    and every failure -- it cannot be imported, is of the wrong type, its
    constructor or ``choose`` raises, it answers something that is not an
    instance index -- is a ``PluginError`` (bad input, exit 2).
    """
    obj = plugins.load(path, "router", importlib.import_module)
    if isinstance(obj, RouterEntry):
        entry = obj
        if not callable(entry.make):
            raise PluginError(path, "is a RouterEntry whose make is not callable")

        def make(c: BuildContext) -> Router:
            return PluginRouter(plugins.call(path, "make()", entry.make, c), path, entry.oracle)

        return RouterEntry(**{**entry.__dict__, "name": path, "make": make})
    if not (isinstance(obj, type) and issubclass(obj, Router)):
        raise PluginError(path, f"is a {type(obj).__name__}, neither a RouterEntry nor a routers.base.Router "
                                f"subclass")
    try:
        flags = {k: bool(getattr(obj, k, False)) for k in ("seeded", "uses_delta", "uses_lambda", "oracle")}
        summary = getattr(obj, "summary", None) or (obj.__doc__ or path).strip().splitlines()[0]
    except Exception as e:  # noqa: BLE001 - a foreign class's attributes may be anything
        raise PluginError(path, f"its class attributes cannot be read: {type(e).__name__}: {e}") from e

    def build(c: BuildContext) -> Router:
        args = (c.inputs, c.seed) if flags["seeded"] else (c.inputs,)
        return PluginRouter(plugins.call(path, "__init__", obj, *args), path, flags["oracle"])

    return RouterEntry(path, str(summary), build, uses_delta=flags["uses_delta"], uses_lambda=flags["uses_lambda"],
                       oracle=flags["oracle"], seeded=flags["seeded"])


def needs_baselines(name: str) -> bool:
    return router_entry(name).needs_baselines


def capabilities(names) -> dict[str, dict]:
    return {n: router_entry(n).capabilities() for n in dict.fromkeys(names)}


def probe_router(name: str, specs, overhead: float = 0.0, seed: int = 0,
                 baselines: dict[str, BaselineParams] | None = None, epsilon: float = DEFAULT_EPSILON) -> None:
    """Build router ``name`` for ``specs`` on a one-request placeholder
    workload without running it: for a plug-in, this imports it, checks its
    type and runs its constructor (``PluginError`` if any fails). A command
    that runs many replays (``sweep``) calls it before it creates anything;
    a single replay builds its router before any output anyway."""
    e = router_entry(name)  # a built-in's name is checked here; building one needs no more than its entry
    if ":" not in name:
        return
    inputs = RouteInputs(prompt=np.ones(1, dtype=np.int64), slo=np.ones(1), utility=np.zeros((1, len(specs))),
                         pred_total=np.ones(1, dtype=np.int64))
    e.make(BuildContext(inputs, list(specs), overhead, 0.0, seed, baselines, False, epsilon,
                        np.ones(1, dtype=np.int64) if e.oracle else None))


def make_router(name: str, inputs: RouteInputs, specs, overhead: float, delta_per_us: float = 0.0, seed: int = 0,
                baselines: dict[str, BaselineParams] | None = None, online_speed: bool = False,
                epsilon: float = DEFAULT_EPSILON, true_outputs=None, ties: str = DEFAULT_TIES,
                learned=None, isolate_s: float | None = None) -> Router:
    """``true_outputs`` reach only a router whose entry says ``oracle``. ``isolate_s``: a plug-in
    router runs in a child process with this per-call limit in seconds (``--isolate-plugins``;
    built-in routers are latroute's own code and run in-process whatever it says)."""
    e = router_entry(name)
    c = BuildContext(inputs, specs, overhead, delta_per_us, seed, baselines, online_speed, epsilon,
                     true_outputs if e.oracle else None, check_ties(ties), learned)
    if isolate_s is not None and ":" in name:
        if e.oracle:
            raise PluginError(name, "declares itself an oracle (handed the live instances): it cannot run "
                                    "isolated (--isolate-plugins)")
        return IsolatedRouter(name, build_plugin_router, c, isolate_s)
    return e.make(c)


def build_plugin_router(path: str, c: BuildContext) -> Router:
    """A plug-in router built from its path (in the child process of an isolated one)."""
    return plugin_entry(path).make(c)
