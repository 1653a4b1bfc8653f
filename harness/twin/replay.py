"""Counterfactual replay: a workload through one router on the twin of a
pool, and the metrics that compare routers (docs/concepts/routing.md).

OnTimeUtility = (1/N) sum_i U_real(i) * 1[TTFT_i <= tau_i], with the
realised utility of the instance that served i (realised accuracy minus
lambda times realised cost); requests never served count as late. A
request the router *shed* (an admitter declined it: ``routers.base.SHED``)
was served nowhere: its instance_id is null, its utility, cost and
accuracy 0, its on_time false -- an SLO miss that adds 0 to OnTimeUtility,
in every metric and in sweeps' AUC alike. Results of a router whose entry
says ``sheds`` also carry ``shed`` (the count) and ``shed_share``.

What the router is told about each request comes from three explicit
policies for what a trace may lack (``traces.policies.lengths``, ``traces.policies.slo``,
``traces.policies.quality``): the predicted output length, the TTFT SLO and the
per-model accuracy. The metrics record the policy of each, and the
served trace carries the SLO and accuracy that were used.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from estimators.learned.model import MIN_SAMPLES, RETRAIN_EVERY_S, WINDOW, LearnedConfig
from harness.twin.pool_baselines import pool_baselines
from harness.twin.pools.spec import Pool
from harness.twin.simulation import Twin, TwinConfig, TwinResult
from harness.twin.views.stale import StaleViews, ViewConfig
from routers.base import RouteInputs
from routers.chance import DEFAULT_EPSILON
from routers.fleet import DEFAULT_TIES, TIE_POLICIES
from routers.foreign import IsolatedRouter
from routers.prefix_affinity import warn_if_blind
from routers.registry import capabilities, make_router, needs_baselines, router_entry
from routers.utility import DEFAULT_LAMBDA, UtilityTables, utility_tables
from traces.policies.lengths import PredictedLengths, predicted_lengths
from traces.policies.quality import QualityTable, quality_table
from traces.policies.slo import SloTargets, slo_targets


@dataclass(frozen=True)
class ReplayConfig:
    router: str = "sfs-hard"
    lam: float = DEFAULT_LAMBDA
    delta_per_us: float = 0.0
    seed: int = 0
    noise: bool = True
    record_steps: bool = False
    lengths: str | None = None  # predicted-length policy (None: column if the trace has it, else median)
    slo: str | None = None  # SLO policy (None: column if the trace has it, else rule)
    quality: str | None = None  # quality policy (None: table if the trace has one, else model)
    online_speed: bool = False  # estimators learn each instance's host speed from its completed steps
    epsilon: float = DEFAULT_EPSILON  # chance-constrained routers' allowed P(late)
    view_interval_ms: float = 0.0  # routers see state published every MS (0: live, every step)
    ledger: bool = True  # with a view interval: requests dispatched since the last publication join the view
    hash_block_tokens: int | None = None  # the trace's (meta.json), for instances with prefix caching
    ties: str = DEFAULT_TIES  # two-level routers: a model's replica (routers.fleet; random: seeded by seed)
    retrain_every_s: float = RETRAIN_EVERY_S  # learned routers: simulated seconds between fits
    window: int = WINDOW  # learned routers: the newest labelled samples a fit uses
    # a plug-in router runs in a child process with this per-call limit in seconds (``--isolate-plugins``;
    # ``estimators.plugin_process``); None: in latroute's process
    plugin_timeout_s: float | None = None

    def learned(self):
        """The learned routers' training schedule (``estimators.learned.model.LearnedConfig``), seeded by the replay."""
        return LearnedConfig(retrain_every_s=float(self.retrain_every_s), window=self.window,
                             min_samples=MIN_SAMPLES, seed=self.seed)

    def __post_init__(self) -> None:
        """Refuse what would replay silently wrong: a NaN delta or lambda makes
        every utility comparison false, so every request went to instance 0."""
        for name, x in (("lam", self.lam), ("delta_per_us", self.delta_per_us),
                        ("view_interval_ms", self.view_interval_ms)):
            if not (isinstance(x, int | float) and math.isfinite(x) and x >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {x!r}")
        if not (isinstance(self.epsilon, int | float) and 0.0 <= self.epsilon < 1.0):
            raise ValueError(f"epsilon must be in [0, 1), got {self.epsilon!r}")
        self.learned()  # LearnedConfig refuses a bad training schedule (interval, window below its min_samples)
        if self.ties not in TIE_POLICIES:
            raise ValueError(f"ties must be one of {', '.join(TIE_POLICIES)}, got {self.ties!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int | np.integer) or not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be an integer in [0, 2**32), got {self.seed!r}")


@dataclass
class ReplayResult:
    requests: pd.DataFrame
    metrics: dict
    twin: TwinResult
    extra: dict = field(default_factory=dict)


@dataclass
class WorkloadInputs:
    """What routers are told about each request, and the policies behind it."""

    lengths: PredictedLengths
    slo: SloTargets
    quality: QualityTable
    utility: UtilityTables
    route: RouteInputs

    def policies(self) -> dict:
        return {"lengths": self.lengths.record(), "slo": self.slo.record(), "quality": self.quality.record()}

    def notes(self) -> list[str]:
        return [self.lengths.note, self.slo.note, self.quality.note]


def workload_inputs(requests: pd.DataFrame, quality: pd.DataFrame | None, specs, cfg: ReplayConfig) -> WorkloadInputs:
    """Apply the length, SLO and quality policies (ValueError: a policy the
    trace cannot serve, or a partial quality table)."""
    lengths = predicted_lengths(requests, cfg.lengths)
    slo = slo_targets(requests, cfg.slo, cfg.seed)
    qual = quality_table(requests, quality, [s.model for s in specs], cfg.quality, cfg.seed)
    util = utility_tables(requests, qual.table, [s.model for s in specs], np.array([s.price_in for s in specs]),
                          np.array([s.price_out for s in specs]), lengths.tokens, cfg.lam)
    route = RouteInputs(prompt=requests["prompt_tokens"].to_numpy(dtype=np.int64), slo=slo.seconds,
                        utility=util.predicted, pred_total=lengths.tokens)
    return WorkloadInputs(lengths, slo, qual, util, route)


def warm_up(specs=None, router="sfs-hard", overhead: float = 0.0, **router_options) -> float:
    """Compile (or load from Numba's cache) the kernels a replay runs, on a
    toy replay, so replay timings and router decision times exclude it.

    With ``specs`` (the replay's own instances) and its router (a registry
    name, or a router itself such as the demo's shortest-queue function),
    the toy runs those instances and that router on two requests: it
    compiles the kernels the replay will call (prefix caching on or off,
    the pool's policies, sync or async scheduling, the fleet loop of a
    replica pool), and nothing else. Without ``specs``: one small vLLM V1
    instance with the prefix cache and sfs-hard, the bench's fixed warm-up.
    Why not always that one: a first run pays for every variant it
    compiles, and a pool without the prefix cache warmed up with it
    compiled both."""
    t0 = time.perf_counter()
    if specs is None:
        from estimators.engine.config import InstanceConfig
        from estimators.timemodel.fit import NoiseModel
        from estimators.timemodel.profile import BatchTimeProfile
        from harness.twin.simulation import InstanceSpec

        prof = BatchTimeProfile("warm", "eq9", np.array([1e-3, 1e-6, 0.0, 0.0]), NoiseModel(log_sigma=0.01))
        specs = [InstanceSpec(InstanceConfig(instance_id="w", max_num_batched_tokens=256, max_num_seqs=8,
                                             num_kv_blocks=100, max_model_len=1024), prof)]
    n = len(specs)
    reqs = pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 0.001], "prompt_tokens": [100, 100],
                         "output_tokens": [3, 3]})
    inputs = RouteInputs(np.array([100, 100]), np.array([1.0, 1.0]), np.zeros((2, n)), np.array([3, 3]))
    made = router if not isinstance(router, str) else make_router(
        router, inputs, specs, overhead, true_outputs=reqs["output_tokens"].to_numpy(), **router_options)
    Twin(specs, TwinConfig(record_steps=False)).run(reqs, made)
    return time.perf_counter() - t0


def replay(pool: Pool, pool_ref: str, requests: pd.DataFrame, quality: pd.DataFrame | None,
           cfg: ReplayConfig, workload: WorkloadInputs | None = None) -> ReplayResult:
    """``workload``: the policies already applied (``workload_inputs``), so
    that a CLI can refuse a bad policy before any work starts."""
    twin = Twin.from_pool(pool, TwinConfig(seed=cfg.seed, noise=cfg.noise, record_steps=cfg.record_steps))
    specs = twin.specs
    workload = workload or workload_inputs(requests, quality, specs, cfg)
    util, inputs = workload.utility, workload.route
    baselines = pool_baselines(pool_ref) if needs_baselines(cfg.router) else None
    router = make_router(cfg.router, inputs, specs, pool.frontend_overhead_s, cfg.delta_per_us, cfg.seed, baselines,
                         online_speed=cfg.online_speed, epsilon=cfg.epsilon,
                         true_outputs=requests["output_tokens"].to_numpy(), ties=cfg.ties, learned=cfg.learned(),
                         isolate_s=cfg.plugin_timeout_s)
    warn_if_blind(router, any(c.caching for c in pool.instances), requests["hash_ids"] if "hash_ids" in requests
                  else None, cfg.hash_block_tokens)  # a prefix-aware router that cannot see a prefix says so
    isolated = isinstance(router, IsolatedRouter)  # its first decisions warm it up; it never runs in-process
    warm_s = 0.0 if isolated else warm_up(specs, cfg.router, pool.frontend_overhead_s, baselines=baselines,
                                          online_speed=cfg.online_speed, epsilon=cfg.epsilon, ties=cfg.ties,
                                          learned=cfg.learned())
    t0 = time.perf_counter()
    oracle = router_entry(cfg.router).oracle
    views = StaleViews(ViewConfig(cfg.view_interval_ms, cfg.ledger)) if cfg.view_interval_ms > 0 and not oracle \
        else None  # the oracle forks the live twin: staleness does not apply to it
    res = twin.run(requests, router, views=views, hash_block_tokens=cfg.hash_block_tokens,
                   predicted=inputs.pred_total)  # what the router's views show as residents' targets
    wall = time.perf_counter() - t0
    if isolated:
        router.close()
    out = res.requests.copy(deep=False)  # copy-on-write: the twin's table stays as it was, its columns shared
    j = res.instance_index  # the twin's own (mapping 3.7M instance ids back to indices cost 0.3 GB at 384 instances)
    shed = j < 0  # served nowhere (the twin routes every other request)
    rows, jj = np.arange(len(out)), np.maximum(j, 0)
    for col, table in (("utility", util.realised), ("cost_micro_usd", util.cost_realised),
                       ("acc", util.acc_realised)):
        v = table[rows, jj]  # a fresh array (fancy indexing)
        v[shed] = 0.0  # a shed request: no answer, no cost
        out[col] = v
    ttft = out["ttft_s"].to_numpy(dtype=np.float64)
    slo = inputs.slo
    out["on_time"] = np.isfinite(ttft) & (ttft <= slo)
    out["slo_ttft_s"] = np.where(np.isfinite(slo), slo, np.nan)  # the SLOs used; none (inf) is stored as null
    m = replay_metrics(out, specs, j)
    if "cached_tokens" in out:  # prefix caching: share of prompt tokens served from the cache
        m["prefix_hit_rate"] = float(out["cached_tokens"].sum()) / max(1.0, float(out["prompt_tokens"].sum()))
    span = res.sim_end_s - float(requests["arrival_s"].iloc[0]) if len(requests) else 0.0
    m.update({"router": cfg.router, "lambda": cfg.lam, "delta_per_us": cfg.delta_per_us, "seed": cfg.seed,
              "epsilon": cfg.epsilon, "ties": cfg.ties, "oracle": oracle, "view_interval_ms": cfg.view_interval_ms,
              "ledger": cfg.ledger, "view_refreshes": views.refreshes if views else None,
              "noise": cfg.noise, "mean_decision_us": router.mean_decision_us, "wall_s": wall, "warmup_s": warm_s,
              **({"router_isolated": True} if isolated else {}),  # absent: in-process (results as before)
              "simulated_s": span, "speedup": span / wall if wall > 0 else None, "steps": res.steps_run,
              "rejected": res.extra.get("rejected", 0), **shed_metrics(cfg.router, int(shed.sum()), len(out)),
              "policies": workload.policies(),
              "online_speed": cfg.online_speed, "host_speed": {sp.instance_id: sp.config.speed for sp in specs},
              "router_capabilities": capabilities([cfg.router])})
    if router_entry(cfg.router).estimator == "learned":
        m["learned"] = cfg.learned().record()
    return ReplayResult(out, m, res, {"quality": workload.quality.table})


def shed_metrics(router: str, shed: int, n: int) -> dict:
    """``shed`` and ``shed_share`` for a router whose entry says it sheds;
    nothing for the others (their results keep the keys they always had)."""
    if not router_entry(router).sheds:
        return {}
    return {"shed": shed, "shed_share": shed / n if n else float("nan")}


def replay_metrics(out: pd.DataFrame, specs, j: np.ndarray) -> dict:
    """``j``: each request's instance index (-1: served nowhere)."""
    n = len(out)
    ttft = out["ttft_s"].to_numpy(dtype=np.float64)
    served = np.isfinite(ttft)
    t = ttft[served]
    pct = (lambda q: float(np.percentile(t, q))) if t.size else (lambda q: float("nan"))
    share_inst = out["instance_id"].value_counts() / n if n else {}  # of every request: shed ones count for none
    m = {
        "requests": n,
        "ontime_utility": float((out["utility"] * out["on_time"]).sum() / n) if n else float("nan"),
        "slo_attainment": float(out["on_time"].mean()) if n else float("nan"),
        "mean_utility": float(out["utility"].mean()) if n else float("nan"),
        "mean_cost_micro_usd": float(out["cost_micro_usd"].mean()) if n else float("nan"),
        "ttft_mean_s": float(t.mean()) if t.size else float("nan"),
        "ttft_p50_s": pct(50), "ttft_p90_s": pct(90), "ttft_p99_s": pct(99),
        "unserved": int((~served).sum()),
        "share_by_instance": {s.instance_id: float(share_inst.get(s.instance_id, 0.0)) for s in specs},
    }
    if "task" in out:  # counts over (task, instance) codes: a task's frame per instance was 1,536 scans at 384
        task = out["task"]
        codes, tasks = pd.factorize(task, sort=True)  # missing tasks: -1, in no group (as groupby drops them)
        k = len(specs)
        counts = np.bincount(codes[(codes >= 0) & (j >= 0)] * k + j[(codes >= 0) & (j >= 0)],
                             minlength=len(tasks) * k).reshape(len(tasks), k)
        sizes = np.bincount(codes[codes >= 0], minlength=len(tasks))
        m["share_by_task"] = {str(t): {s.instance_id: float(counts[a, b] / sizes[a]) for b, s in enumerate(specs)}
                              for a, t in enumerate(tasks)}
    return m
