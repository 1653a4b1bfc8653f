"""Sweeps: many replays (rates x routers x deltas x lambdas x seeds) in a
process pool, and the summaries that compare routers.

Every cell is fully determined by its parameters (the workload seed comes
from the cell's seed and rate, the twin's from its seed), and results are
ordered by cell, so the output is the same whatever the worker count.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from harness.pools import load_pool
from harness.replay import ReplayConfig, replay
from routers.registry import BASELINE_ROUTERS
from routers.utility import DEFAULT_LAMBDA
from traces.arrivals import ArrivalSpec
from traces.workload import WorkloadConfig, generate_workload


@dataclass(frozen=True)
class Cell:
    rate: float
    router: str
    delta_per_us: float = 0.0
    lam: float = DEFAULT_LAMBDA
    seed: int = 0


@dataclass(frozen=True)
class SweepSpec:
    pool: str = "qwen3-h100"
    requests: int = 16000
    arrival: str = "poisson"
    burst_ratio: float = 3.0
    high_fraction: float = 0.2
    correlation_s: float = 2.0
    noise: bool = True


def workload_seed(seed: int, rate: float) -> int:
    return int(np.random.SeedSequence([seed, int(round(rate * 1000))]).generate_state(1)[0])


def run_cell(spec: SweepSpec, cell: Cell) -> dict:
    arrivals = ArrivalSpec(spec.arrival, cell.rate, spec.burst_ratio, spec.high_fraction, spec.correlation_s)
    wl = generate_workload(WorkloadConfig(requests=spec.requests, arrivals=arrivals,
                                          seed=workload_seed(cell.seed, cell.rate)))
    res = replay(load_pool(spec.pool), spec.pool, wl.requests, wl.quality,
                 ReplayConfig(router=cell.router, lam=cell.lam, delta_per_us=cell.delta_per_us, seed=cell.seed,
                              noise=spec.noise))
    m = res.metrics
    row = {**asdict(cell), "arrival": spec.arrival, "requests": spec.requests}
    for k in ("ontime_utility", "slo_attainment", "mean_utility", "mean_cost_micro_usd", "ttft_mean_s",
              "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "unserved", "mean_decision_us", "wall_s", "simulated_s",
              "speedup"):
        row[k] = m[k]
    for inst, share in m["share_by_instance"].items():
        row[f"share_{inst}"] = share
    return row


def _run(args):
    return run_cell(*args)


def run_sweep(spec: SweepSpec, cells: list[Cell], workers: int = 1,
              progress: Callable[[int], None] | None = None) -> pd.DataFrame:
    rows: list[dict] = []
    if workers <= 1:
        for c in cells:
            rows.append(run_cell(spec, c))
            if progress:
                progress(1)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for row in pool.map(_run, [(spec, c) for c in cells]):
                rows.append(row)
                if progress:
                    progress(1)
    df = pd.DataFrame(rows)
    return df.sort_values(["seed", "lam", "router", "delta_per_us", "rate"], kind="stable").reset_index(drop=True)


def auc(rates: np.ndarray, values: np.ndarray) -> float:
    """Trapezoidal area under values(rate)."""
    order = np.argsort(rates)
    r, v = rates[order], values[order]
    return float(np.sum((r[1:] - r[:-1]) * (v[1:] + v[:-1]) / 2.0)) if len(r) > 1 else float("nan")


def summarize_sweep(df: pd.DataFrame) -> dict:
    """Per router (and delta, lambda): OnTimeUtility AUC over the rates,
    averaged over seeds, and its ratio to the best baseline router."""
    out: dict = {"rates": sorted(float(r) for r in df["rate"].unique())}
    out["rate_range"] = [out["rates"][0], out["rates"][-1]]
    mean = df.groupby(["lam", "router", "delta_per_us", "rate"], as_index=False).mean(numeric_only=True)
    routers = {}
    for (lam, router, delta), g in mean.groupby(["lam", "router", "delta_per_us"]):
        key = router if delta == 0 or not router.endswith("-soft") else f"{router}(delta={delta:g})"
        if len(df["lam"].unique()) > 1:
            key = f"{key}[lambda={lam:g}]"
        routers[key] = {
            "router": router, "lambda": float(lam), "delta_per_us": float(delta),
            "auc_ontime_utility": auc(g["rate"].to_numpy(), g["ontime_utility"].to_numpy()),
            "auc_slo_attainment": auc(g["rate"].to_numpy(), g["slo_attainment"].to_numpy()),
            "by_rate": {f"{r:g}": {"ontime_utility": float(o), "slo_attainment": float(a), "ttft_mean_s": float(tm),
                                   "mean_utility": float(mu)}
                        for r, o, a, tm, mu in zip(g["rate"], g["ontime_utility"], g["slo_attainment"],
                                                   g["ttft_mean_s"], g["mean_utility"])},
        }
    base = {k: v["auc_ontime_utility"] for k, v in routers.items() if v["router"] in BASELINE_ROUTERS
            and (v["delta_per_us"] == 0)}
    if base:
        best_key = max(base, key=base.get)
        out["best_baseline"] = {"router": best_key, "auc_ontime_utility": base[best_key]}
        for v in routers.values():
            v["auc_ratio_to_best_baseline"] = v["auc_ontime_utility"] / base[best_key] if base[best_key] else None
    out["routers"] = routers
    soft = mean[mean["router"].str.endswith("-soft")]
    if len(soft["delta_per_us"].unique()) > 1:
        out["frontier"] = [{"router": r, "rate": float(rt), "delta_per_us": float(d), "lambda": float(lam),
                            "mean_utility": float(mu), "ontime_utility": float(o), "ttft_mean_s": float(tm)}
                           for r, rt, d, lam, mu, o, tm in zip(soft["router"], soft["rate"], soft["delta_per_us"],
                                                               soft["lam"], soft["mean_utility"],
                                                               soft["ontime_utility"], soft["ttft_mean_s"])]
    return out


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 2))


def sweep_result(spec: SweepSpec, cells: list[Cell], workers: int, progress=None) -> tuple[pd.DataFrame, dict]:
    """Run the cells and summarise them, recording the sweep's parameters."""
    df = run_sweep(spec, cells, workers, progress)
    summary = summarize_sweep(df)
    summary.update({"pool": spec.pool, "arrival": spec.arrival, "burst_ratio": spec.burst_ratio,
                    "requests": spec.requests, "seeds": len({c.seed for c in cells}), "cells": len(cells)})
    return df, summary


def write_sweep_result(out, df: pd.DataFrame, summary: dict, force: bool = False) -> None:
    from traces.store import StagedDir, write_json, write_parquet

    with StagedDir(out, force) as tmp:
        write_parquet(tmp / "results.parquet", df)
        write_json(tmp / "metrics.json", summary)
