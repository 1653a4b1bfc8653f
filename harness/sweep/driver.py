"""Sweeps: many replays (rates x routers x deltas x lambdas x seeds) on a
local process pool or Ray (``sweep_backends``), every finished cell written
at once (``sweep_store``), and the summaries that compare routers, with
confidence intervals over paired seeds (``sweep_stats``).

Every cell is fully determined by its parameters (the workload seed comes
from the cell's seed and rate, the twin's from its seed), and results are
ordered by cell, so the output is the same whatever the backend, the worker
count or the number of runs a resumed sweep took. Wall-clock figures of a
cell go to ``timings.parquet``, apart from the results.

A cell's workload is generated (the paper's workload with the sweep's
arrival process) or, with ``SweepSpec.trace``, a trace's requests with
their arrival times rescaled to the cell's rate. Each row records the
inter-arrival CV^2 of the arrivals the cell replayed, so a sweep's
burstiness can be checked from its results.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from estimators.learned.model import RETRAIN_EVERY_S, WINDOW
from harness.sweep.backends import check_ray, latched_interrupts, run_cells
from harness.sweep.store import SweepStore, cell_key, check_sweep_out
from harness.twin.pools.spec import load_pool
from harness.twin.replay import ReplayConfig, WorkloadInputs, replay, workload_inputs
from harness.twin.simulation import InstanceSpec
from reports.paired_stats import mean_ci, paired
from reports.serving import serving_metrics, tidy
from routers.chance import DEFAULT_EPSILON
from routers.fleet import DEFAULT_TIES
from routers.registry import capabilities
from routers.utility import DEFAULT_LAMBDA
from traces.errors import BadOption
from traces.store import open_trace
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload


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
    burstiness: float = 1.0  # gamma: shape (inter-arrival CV^2 = 1/burstiness)
    noise: bool = True
    trace: str | None = None  # replay this trace's requests (arrivals rescaled to each rate) instead of generating
    lengths: str | None = None  # predicted-length policy (None: the default)
    slo: str | None = None  # SLO policy (None: the default)
    quality: str | None = None  # quality policy (None: the default)
    online_speed: bool = False  # estimators learn each instance's host speed from its completed steps
    percentiles: tuple[float, ...] = (50.0, 90.0, 99.0)  # serving-metric percentiles (reports.serving)
    goodput: tuple[tuple[str, float], ...] = ()  # goodput bounds in ms, e.g. (("ttft", 200.0),)
    epsilon: float = DEFAULT_EPSILON  # chance-constrained routers
    view_interval_ms: float = 0.0  # stale views (0: live)
    ledger: bool = True
    ties: str = DEFAULT_TIES  # two-level routers: a model's replica (routers.fleet)
    retrain_every_s: float = RETRAIN_EVERY_S  # learned routers: simulated seconds between fits
    window: int = WINDOW  # learned routers: samples per fit
    # plug-in routers run each in a child process with this per-call limit in seconds (--isolate-plugins);
    # None: in-process
    plugin_timeout_s: float | None = None

    def replay_config(self, cell: Cell) -> ReplayConfig:
        # a trace's prompt blocks (hash_ids) are per hash_block_tokens tokens, stated in its meta.json; without
        # it instances with prefix caching would see no shared prefix at all
        hash_block = open_trace(self.trace).meta.get("hash_block_tokens") if self.trace is not None else None
        return ReplayConfig(router=cell.router, lam=cell.lam, delta_per_us=cell.delta_per_us, seed=cell.seed,
                            noise=self.noise, lengths=self.lengths, slo=self.slo, quality=self.quality,
                            online_speed=self.online_speed,
                            epsilon=self.epsilon, view_interval_ms=self.view_interval_ms, ledger=self.ledger,
                            hash_block_tokens=hash_block, ties=self.ties, retrain_every_s=self.retrain_every_s,
                            window=self.window, plugin_timeout_s=self.plugin_timeout_s)


def workload_seed(seed: int, rate: float) -> int:
    return int(np.random.SeedSequence([seed, int(round(rate * 1000))]).generate_state(1)[0])


def rescaled_arrivals(arrival_s: np.ndarray, rate: float) -> np.ndarray:
    """Arrival times shifted to start at 0 and stretched to mean rate ``rate``
    (the shape of the trace's arrival process is kept)."""
    t = arrival_s - arrival_s[0]
    return t * ((t.size - 1) / t[-1] / rate) if t.size > 1 and t[-1] > 0 else t


def cell_workload(spec: SweepSpec, cell: Cell) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """The requests (and quality table, if any) a cell replays."""
    if spec.trace is not None:
        tr = open_trace(spec.trace)
        reqs = tr.read("requests", head=spec.requests)  # a cell's rows, not a fleet-sized trace's
        reqs["arrival_s"] = rescaled_arrivals(reqs["arrival_s"].to_numpy(dtype=np.float64), cell.rate)
        ids = reqs["request_id"].to_numpy(dtype=np.int64)
        return reqs, tr.read("quality", request_ids=ids) if tr.has("quality") else None
    arrivals = ArrivalSpec(spec.arrival, cell.rate, spec.burst_ratio, spec.high_fraction, spec.correlation_s,
                           spec.burstiness)
    wl = generate_workload(WorkloadConfig(requests=spec.requests, arrivals=arrivals,
                                          seed=workload_seed(cell.seed, cell.rate)))
    return wl.requests, wl.quality


def sweep_inputs(spec: SweepSpec, cell: Cell) -> WorkloadInputs:
    """The policies applied to ``cell``'s workload: every cell of a sweep
    resolves them alike, so the first cell tells (and refuses) for all."""
    reqs, quality = cell_workload(spec, cell)
    specs = [InstanceSpec.from_config(c) for c in load_pool(spec.pool).instances]
    return workload_inputs(reqs, quality, specs, spec.replay_config(cell))


def interarrival_cv2(arrival_s: np.ndarray) -> float:
    gaps = np.diff(np.sort(arrival_s))
    return float(gaps.var() / gaps.mean() ** 2) if gaps.size > 1 and gaps.mean() > 0 else float("nan")


def run_cell(spec: SweepSpec, cell: Cell) -> dict:
    reqs, quality = cell_workload(spec, cell)
    res = replay(load_pool(spec.pool), spec.pool, reqs, quality, spec.replay_config(cell))
    m = res.metrics
    row = {**asdict(cell), "arrival": spec.arrival, "requests": len(reqs),
           "interarrival_cv2": interarrival_cv2(res.requests["arrival_s"].to_numpy(dtype=np.float64))}
    row.update({f"{k}_policy": v["policy"] for k, v in m["policies"].items()})
    for k in ("ontime_utility", "slo_attainment", "mean_utility", "mean_cost_micro_usd", "ttft_mean_s",
              "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "unserved", "simulated_s"):
        row[k] = m[k]
    for k in ("prefix_hit_rate", "shed", "shed_share", "router_isolated"):  # prefix caching; a router that
        # sheds (llmd-admit); a plug-in router run in a process of its own (--isolate-plugins)
        if k in m:
            row[k] = m[k]
    for inst, share in m["share_by_instance"].items():
        row[f"share_{inst}"] = share
    row.update(serving_columns(serving_metrics(res.requests, spec.percentiles, dict(spec.goodput))))
    timing = {k: m[k] for k in TIMING_COLUMNS}
    return row, timing


def serving_columns(serving: dict) -> dict:
    """A cell's serving metrics as flat ``serve_<metric>__<stat>`` columns
    (results.parquet stays one row per cell; metrics.parquet melts them)."""
    return {f"serve_{r.metric}__{r.stat}": r.value for r in tidy(serving).itertuples()}


TIMING_COLUMNS = ("wall_s", "speedup", "mean_decision_us")
CELL_ORDER = ["seed", "lam", "router", "delta_per_us", "rate"]


def run_sweep(spec: SweepSpec, cells: list[Cell], workers: int = 1,
              progress: Callable[[], None] | None = None, backend: str = "local", address: str | None = None,
              store: SweepStore | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run the cells (those without a part in ``store``), writing each as it
    finishes; returns (results, timings) over every cell, ordered by cell."""
    done = store.done() if store is not None else set()
    todo = [c for c in cells if cell_key(c) not in done]
    rows, timings = [], []
    with latched_interrupts() as check_interrupt:
        for cell, row, timing in run_cells(run_cell, spec, todo, workers, backend, address):
            key = cell_key(cell)
            if store is not None:
                store.write_cell(key, row, timing)
            rows.append(row)
            timings.append({"cell": key, **timing})
            if progress:
                progress()
            check_interrupt()
    if store is not None:
        df, tim = store.rows()
    else:
        df, tim = pd.DataFrame(rows), pd.DataFrame(timings)
    df = df.sort_values(CELL_ORDER, kind="stable").reset_index(drop=True)
    return df, tim.sort_values("cell").reset_index(drop=True) if len(tim) else tim


def router_key(router: str, delta: float, lam: float, several_lambdas: bool, caps: dict) -> str:
    """A sweep's name for a (router, delta, lambda) cell family."""
    key = f"{router}(delta={delta:g})" if caps[router]["uses_delta"] and delta != 0 else router
    return f"{key}[lambda={lam:g}]" if several_lambdas else key


def seed_aucs(df: pd.DataFrame, caps: dict) -> dict[str, np.ndarray]:
    """Per router key, its OnTimeUtility AUC for each seed (in seed order)."""
    several = len(df["lam"].unique()) > 1
    out: dict[str, np.ndarray] = {}
    for (lam, router, delta), g in df.groupby(["lam", "router", "delta_per_us"]):
        per = g.groupby("seed").apply(lambda s: auc(s["rate"].to_numpy(), s["ontime_utility"].to_numpy()),
                                      include_groups=False)
        out[router_key(router, delta, lam, several, caps)] = per.sort_index().to_numpy()
    return out


def auc(rates: np.ndarray, values: np.ndarray) -> float:
    """Trapezoidal area under values(rate)."""
    order = np.argsort(rates)
    r, v = rates[order], values[order]
    return float(np.sum((r[1:] - r[:-1]) * (v[1:] + v[:-1]) / 2.0)) if len(r) > 1 else float("nan")


def compare_oracle_and_others(routers: dict, per_seed: dict, caps: dict, out: dict) -> None:
    """Each router's AUC as a share of the oracle's (when the sweep ran
    one; paired over seeds), and its ratio to the best *other* non-oracle
    router (every router, not only the paper's baselines)."""
    oracles = [k for k, v in routers.items() if caps[v["router"]]["oracle"]]
    if oracles:
        ok = oracles[0]
        ref = routers[ok]["auc_ontime_utility"]
        out["oracle"] = {"router": ok, "auc_ontime_utility": ref}
        for key, v in routers.items():
            v["oracle_share"] = v["auc_ontime_utility"] / ref if ref else None
            if key != ok:
                v["vs_oracle"] = paired(per_seed[key], per_seed[ok])
    honest = [k for k, v in routers.items() if not caps[v["router"]]["oracle"]]
    for key in honest:
        others = [k for k in honest if k != key]
        if not others:
            continue
        best = max(others, key=lambda k: routers[k]["auc_ontime_utility"])
        b = routers[best]["auc_ontime_utility"]
        routers[key]["best_other"] = {"router": best, "ratio": routers[key]["auc_ontime_utility"] / b if b else None,
                                      "paired": paired(per_seed[key], per_seed[best])}


def summarize_sweep(df: pd.DataFrame) -> dict:
    """Per router (and delta, lambda): OnTimeUtility AUC over the rates,
    averaged over seeds, and its ratio to the best baseline router. What
    each router is (soft, baseline, ...) comes from the registry and is
    recorded under ``router_capabilities`` for reports."""
    caps = capabilities(df["router"].unique())
    out: dict = {"rates": sorted(float(r) for r in df["rate"].unique()), "router_capabilities": caps}
    out["rate_range"] = [out["rates"][0], out["rates"][-1]]
    mean = df.groupby(["lam", "router", "delta_per_us", "rate"], as_index=False).mean(numeric_only=True)
    routers = {}
    several = len(df["lam"].unique()) > 1
    for (lam, router, delta), g in mean.groupby(["lam", "router", "delta_per_us"]):
        key = router_key(router, delta, lam, several, caps)
        routers[key] = {
            "router": router, "lambda": float(lam), "delta_per_us": float(delta),
            "auc_ontime_utility": auc(g["rate"].to_numpy(), g["ontime_utility"].to_numpy()),
            "auc_slo_attainment": auc(g["rate"].to_numpy(), g["slo_attainment"].to_numpy()),
            "by_rate": {f"{r:g}": {"ontime_utility": float(o), "slo_attainment": float(a), "ttft_mean_s": float(tm),
                                   "mean_utility": float(mu)}
                        for r, o, a, tm, mu in zip(g["rate"], g["ontime_utility"], g["slo_attainment"],
                                                   g["ttft_mean_s"], g["mean_utility"])},
        }
    per_seed = seed_aucs(df, caps)
    for key, v in routers.items():
        v["auc_ontime_utility_ci"] = mean_ci(per_seed[key])
    base = {k: v["auc_ontime_utility"] for k, v in routers.items() if caps[v["router"]]["baseline"]
            and (v["delta_per_us"] == 0)}
    if base:
        best_key = max(base, key=base.get)
        out["best_baseline"] = {"router": best_key, "auc_ontime_utility": base[best_key]}
        for key, v in routers.items():
            v["auc_ratio_to_best_baseline"] = v["auc_ontime_utility"] / base[best_key] if base[best_key] else None
            if key != best_key:
                v["vs_best_baseline"] = paired(per_seed[key], per_seed[best_key])
    compare_oracle_and_others(routers, per_seed, caps, out)
    out["routers"] = routers
    soft = mean[mean["router"].map(lambda r: caps[r]["uses_delta"])]
    if len(soft["delta_per_us"].unique()) > 1:
        out["frontier"] = [{"router": r, "rate": float(rt), "delta_per_us": float(d), "lambda": float(lam),
                            "mean_utility": float(mu), "ontime_utility": float(o), "ttft_mean_s": float(tm)}
                           for r, rt, d, lam, mu, o, tm in zip(soft["router"], soft["rate"], soft["delta_per_us"],
                                                               soft["lam"], soft["mean_utility"],
                                                               soft["ontime_utility"], soft["ttft_mean_s"])]
    return out


def check_workers(workers: int, backend: str = "local", address: str | None = None) -> None:
    """Refuse a worker count this machine cannot run: below 1, or above its
    cores (thousands of forked workers would take the machine down; an
    existing Ray cluster, ``address``, has its own cores)."""
    cores = os.cpu_count() or 1
    if workers < 1:
        raise BadOption("--workers", f"must be >= 1, got {workers}")
    if workers > cores and not (backend == "ray" and address):
        raise BadOption("--workers", f"{workers} is more than this machine's {cores} cores")


def check_sweep_run(out, workers: int, backend: str = "local", address: str | None = None, resume: bool = False,
                    force: bool = False, trace: str | Path | None = None) -> None:
    """Everything a sweep refuses before any work: the worker count and
    the output directory (``sweep_store.check_sweep_out``)."""
    check_workers(workers, backend, address)
    if backend == "ray":
        check_ray()
    check_sweep_out(out, resume, force, inputs=[trace])


def spec_doc(spec: SweepSpec, cells: list[Cell]) -> dict:
    """The full specification of a sweep, as stored in ``sweep.json``."""
    import json

    # through JSON, so tuples read back from sweep.json as lists compare equal on --resume
    doc = asdict(spec)
    if doc["plugin_timeout_s"] is None:  # in-process plug-ins: the spec as sweeps wrote it before the option
        del doc["plugin_timeout_s"]
    return json.loads(json.dumps({"spec": doc, "cells": [asdict(c) for c in cells]}))


def sweep_result(spec: SweepSpec, cells: list[Cell], workers: int, progress=None, backend: str = "local",
                 address: str | None = None, store: SweepStore | None = None
                 ) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """Run the cells and summarise them, recording the sweep's parameters.
    On any failure or interrupt the store's lock is released; its finished
    cells and INCOMPLETE stay, for ``--resume``."""
    try:
        df, timings = run_sweep(spec, cells, workers, progress, backend, address, store)
        summary = summarize_sweep(df)
        summary.update({"pool": spec.pool, "arrival": spec.arrival, "burst_ratio": spec.burst_ratio,
                        "burstiness": spec.burstiness, "trace": spec.trace, "ties": spec.ties,
                        "retrain_every_s": spec.retrain_every_s, "window": spec.window,
                        **({"plugins_isolated": True, "plugin_timeout_s": spec.plugin_timeout_s}
                           if spec.plugin_timeout_s is not None else {}),
                        "requests": int(df["requests"].max()),
                        "seeds": len({c.seed for c in cells}), "cells": len(cells),
                        "interarrival_cv2": float(df["interarrival_cv2"].mean()),
                        "policies": sweep_inputs(spec, cells[0]).policies()})
    except BaseException:
        if store is not None:
            store.close()
        raise
    return df, timings, summary


def write_sweep_result(store: SweepStore, df: pd.DataFrame, timings: pd.DataFrame, summary: dict,
                       command: str | None = None) -> None:
    from reports.results import result_header
    from traces.files.outputs import write_json, write_parquet

    store.finish({"results.parquet": lambda p: write_parquet(Path(p), df),
                  "metrics.parquet": lambda p: write_parquet(Path(p), long_metrics(df)),
                  "timings.parquet": lambda p: write_parquet(Path(p), timings),
                  "metrics.json": lambda p: write_json(Path(p), {**result_header("sweep", command), **summary})})


def long_metrics(df: pd.DataFrame) -> pd.DataFrame:
    """Tidy metrics: one row per (cell, metric, stat), every metric of
    results.parquet (OnTimeUtility, SLO attainment, ... and the serving
    metrics in ms), for DuckDB queries without JSON keys."""
    keys = [c for c in ("router", "delta_per_us", "lam", "rate", "seed") if c in df.columns]
    plain = [c for c in ("ontime_utility", "slo_attainment", "mean_utility", "mean_cost_micro_usd", "unserved")
             if c in df.columns]
    serve = [c for c in df.columns if c.startswith("serve_")]
    long = df[keys + plain + serve].melt(id_vars=keys, var_name="column", value_name="value")
    split = long["column"].str.removeprefix("serve_").str.split("__", n=1, expand=True)
    long["metric"] = split[0]
    long["stat"] = split[1].fillna("value") if split.shape[1] > 1 else "value"
    return long[keys + ["metric", "stat", "value"]].reset_index(drop=True)


def run_and_write_sweep(out, spec: SweepSpec, cells: list[Cell], workers: int, backend: str = "local",
                        address: str | None = None, resume: bool = False, force: bool = False,
                        progress: Callable[[], None] | None = None, command: str | None = None
                        ) -> tuple[pd.DataFrame, dict]:
    """A whole sweep into ``out``: open (or resume) its store, run what is
    missing, write the final results."""
    check_sweep_run(out, workers, backend, address, resume, force, spec.trace)
    store = SweepStore(out, spec_doc(spec, cells), resume=resume, force=force, inputs=[spec.trace])
    df, timings, summary = sweep_result(spec, cells, workers, progress, backend, address, store)
    summary["backend"] = backend
    write_sweep_result(store, df, timings, summary, command)
    return df, summary
