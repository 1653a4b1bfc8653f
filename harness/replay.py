"""Counterfactual replay: a workload through one router on the twin of a
pool, and the metrics that compare routers (DESIGN section 1).

OnTimeUtility = (1/N) sum_i U_real(i) * 1[TTFT_i <= tau_i], with the
realised utility of the instance that served i (realised accuracy minus
lambda times realised cost); requests never served count as late.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from harness.pool_baselines import pool_baselines
from harness.pools import Pool
from harness.twin import Twin, TwinConfig, TwinResult
from routers.base import RouteInputs
from routers.registry import make_router, needs_baselines
from routers.utility import DEFAULT_LAMBDA, utility_tables


@dataclass(frozen=True)
class ReplayConfig:
    router: str = "sfs-hard"
    lam: float = DEFAULT_LAMBDA
    delta_per_us: float = 0.0
    seed: int = 0
    noise: bool = True
    record_steps: bool = False
    hash_block_tokens: int | None = None  # the trace's (meta.json), for instances with prefix caching


@dataclass
class ReplayResult:
    requests: pd.DataFrame
    metrics: dict
    twin: TwinResult
    extra: dict = field(default_factory=dict)


def route_inputs(requests: pd.DataFrame, util_pred: np.ndarray) -> RouteInputs:
    pred = requests["predicted_output_tokens"] if "predicted_output_tokens" in requests else requests["output_tokens"]
    pred = pred.fillna(requests["output_tokens"].median()).to_numpy(dtype=np.float64)
    slo = requests["slo_ttft_s"].to_numpy(dtype=np.float64) if "slo_ttft_s" in requests else np.full(len(requests), np.inf)
    return RouteInputs(prompt=requests["prompt_tokens"].to_numpy(dtype=np.int64), slo=np.nan_to_num(slo, nan=np.inf),
                       utility=util_pred, pred_total=np.maximum(pred, 1).astype(np.int64))


def warm_up() -> float:
    """Compile (or load from Numba's cache) the twin and SFS kernels on a toy
    replay, so replay timings and router decision times exclude it."""
    t0 = time.perf_counter()
    from estimators.batch_fit import NoiseModel
    from estimators.engine.config import InstanceConfig
    from estimators.profile import BatchTimeProfile
    from harness.twin import InstanceSpec

    prof = BatchTimeProfile("warm", "eq9", np.array([1e-3, 1e-6, 0.0, 0.0]), NoiseModel(log_sigma=0.01))
    specs = [InstanceSpec(InstanceConfig(instance_id="w", max_num_batched_tokens=256, max_num_seqs=8,
                                         num_kv_blocks=100, max_model_len=1024), prof)]
    reqs = pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 0.001], "prompt_tokens": [100, 100],
                         "output_tokens": [3, 3]})
    inputs = RouteInputs(np.array([100, 100]), np.array([1.0, 1.0]), np.zeros((2, 1)), np.array([3, 3]))
    Twin(specs, TwinConfig(record_steps=False)).run(reqs, make_router("sfs-hard", inputs, specs, 0.0))
    return time.perf_counter() - t0


def replay(pool: Pool, pool_ref: str, requests: pd.DataFrame, quality: pd.DataFrame | None,
           cfg: ReplayConfig) -> ReplayResult:
    twin = Twin.from_pool(pool, TwinConfig(seed=cfg.seed, noise=cfg.noise, record_steps=cfg.record_steps))
    specs = twin.specs
    models = [s.model for s in specs]
    util = utility_tables(requests, quality, models, np.array([s.price_in for s in specs]),
                          np.array([s.price_out for s in specs]), cfg.lam)
    inputs = route_inputs(requests, util.predicted)
    baselines = pool_baselines(pool_ref) if needs_baselines(cfg.router) else None
    router = make_router(cfg.router, inputs, specs, pool.frontend_overhead_s, cfg.delta_per_us, cfg.seed, baselines)
    warm_s = warm_up()
    t0 = time.perf_counter()
    res = twin.run(requests, router, hash_block_tokens=cfg.hash_block_tokens)
    wall = time.perf_counter() - t0
    out = res.requests.copy()
    idx = {s.instance_id: k for k, s in enumerate(specs)}
    j = out["instance_id"].map(idx).to_numpy()
    rows = np.arange(len(out))
    out["utility"] = util.realised[rows, j]
    out["cost_micro_usd"] = util.cost_realised[rows, j]
    out["acc"] = util.acc_realised[rows, j]
    ttft = out["ttft_s"].to_numpy(dtype=np.float64)
    slo = inputs.slo
    out["on_time"] = np.isfinite(ttft) & (ttft <= slo)
    m = replay_metrics(out, specs)
    if "cached_tokens" in out:  # prefix caching: share of prompt tokens served from the cache
        m["prefix_hit_rate"] = float(out["cached_tokens"].sum()) / max(1.0, float(out["prompt_tokens"].sum()))
    span = res.sim_end_s - float(requests["arrival_s"].iloc[0]) if len(requests) else 0.0
    m.update({"router": cfg.router, "lambda": cfg.lam, "delta_per_us": cfg.delta_per_us, "seed": cfg.seed,
              "noise": cfg.noise, "mean_decision_us": router.mean_decision_us, "wall_s": wall, "warmup_s": warm_s,
              "simulated_s": span, "speedup": span / wall if wall > 0 else None, "steps": res.steps_run,
              "rejected": res.extra.get("rejected", 0)})
    return ReplayResult(out, m, res)


def replay_metrics(out: pd.DataFrame, specs) -> dict:
    n = len(out)
    ttft = out["ttft_s"].to_numpy(dtype=np.float64)
    served = np.isfinite(ttft)
    t = ttft[served]
    pct = (lambda q: float(np.percentile(t, q))) if t.size else (lambda q: float("nan"))
    share_inst = out["instance_id"].value_counts(normalize=True)
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
    if "task" in out:
        m["share_by_task"] = {str(task): {s.instance_id: float(v) for s, v in zip(
            specs, [(g["instance_id"] == s.instance_id).mean() for s in specs])}
            for task, g in out.groupby("task")}
    return m
