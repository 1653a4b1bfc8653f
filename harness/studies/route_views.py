"""What a live router loses with each view (``latroute study
route-views``): the same workload through ``latroute
route`` with one router and each ``--view`` in turn, on ``latroute serve``
backends of one pool, each run on freshly started backends (same noise
seed), and per view: SLO attainment, OnTimeUtility with the *predicted*
accuracy (the proxy knows no realised one), TTFT percentiles, and how far
the router's estimate for the chosen backend was from the TTFT the proxy
then saw (median signed and absolute error), from the decision log.

The workload is generated (``latroute trace generate``, the paper's task
mix, Poisson) at ``--rate`` requests per *engine* second; arrivals are
replayed open loop by ``latroute loadgen`` at ``rate x speed`` per wall
second, since the backends run ``--speed`` times faster than real time.
Prints a Markdown table.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from harness.live.ports import free_port_base
from harness.live.processes import loadgen, start_ready, stop

VIEWS = ("exact", "ledger", "metrics:100", "metrics:1000")


def view_metrics(log: Path) -> dict:
    """One run's figures from its decision log (a ``route --log`` trace)."""
    from traces.store import open_trace

    t = open_trace(log)
    req, dec = t.read("requests"), t.read("decisions")
    chosen = dec[dec["chosen"] & (dec["attempt"] == 0)].set_index("request_id")
    r = req.set_index("request_id").join(chosen[["utility_hat", "estimate_s"]], how="left")
    ok = r[r["status"] == "ok"]
    on_time = (r["ttft_s"] <= r["slo_ttft_s"]) & (r["status"] == "ok")
    err = (ok["estimate_s"] - ok["ttft_s"]) * 1e3
    return {"requests": len(r), "ok": len(ok), "slo_attainment": float(on_time.mean()),
            "ontime_utility_hat": float((r["utility_hat"].fillna(0) * on_time).mean()),
            "ttft_p50_ms": float(ok["ttft_s"].quantile(0.5) * 1e3), "ttft_p99_ms": float(ok["ttft_s"].quantile(0.99) * 1e3),
            "est_err_median_ms": float(err.median()), "est_abs_err_median_ms": float(err.abs().median()),
            "mean_view_age_ms": float(dec["view_age_s"].mean() * 1e3),
            "shares": {k: round(float(v), 3) for k, v in r["instance_id"].value_counts(normalize=True).items()}}


def run(pool: str, router: str, views: list[str], requests: int, rate: float, speed: float, seed: int,
        work: Path, repeats: int = 1) -> pd.DataFrame:
    from harness.twin.pools.spec import load_pool

    n = len(load_pool(pool).instances)
    trace = work / "workload"
    subprocess.run([sys.executable, "-m", "harness.cli", "trace", "generate", "--requests", str(requests),
                    "--rate", str(rate * speed), "--seed", str(seed), "--out", str(trace)], check=True,
                   capture_output=True, timeout=300)
    rows = []
    order = [(r, views[(k + r) % len(views)]) for r in range(repeats) for k in range(len(views))]  # rotated
    for rep, view in order:
        kind, _, interval = view.partition(":")
        base = free_port_base(n)
        urls = ",".join(f"http://127.0.0.1:{base + k}" for k in range(n))
        serve = start_ready(["serve", "--pool", pool, "--port-base", str(base), "--speed", str(speed), "--seed",
                             str(seed + rep)], work)
        try:
            port = free_port_base(1)
            extra = ["--poll-interval", interval] if interval else []
            log = work / f"log-{kind}-{interval or 0}"
            proxy = start_ready(["route", "--pool", pool, "--backends", urls, "--router", router, "--listen",
                                 f"127.0.0.1:{port}", "--view", kind, "--speed", str(speed), "--seed", str(seed),
                                 "--log", str(log), "--force", *extra], work)
            try:
                loadgen(work, work / f"client-{view.replace(':', '-')}", ["--base-url", f"http://127.0.0.1:{port}"],
                        ["--trace", str(trace)])
            finally:
                stop(proxy)
        finally:
            stop(serve)
        rows.append({"view": view, "repeat": rep, **view_metrics(log)})
    return pd.DataFrame(rows)


def study(pool: str, router: str, views: list[str], requests: int, rate: float, speed: float, seed: int,
          repeats: int, echo=print) -> None:
    """Run every view and print the tables (means over repeats when there are several, then every run)."""
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        df = run(pool, router, views, requests, rate, speed, seed, Path(d), repeats)
    echo(f"{router} on {pool}, {requests} requests at {rate:g} q/s (engine), serve --speed {speed:g}, "
         f"{repeats} repeat(s); load average {load:.1f} -> {os.getloadavg()[0]:.1f}\n")
    if repeats > 1:
        figs = ["slo_attainment", "ontime_utility_hat", "ttft_p50_ms", "ttft_p99_ms", "est_abs_err_median_ms"]
        g = df.groupby("view", sort=False)[figs]
        echo("| view | " + " | ".join(f"{f} (mean ± sd)" for f in figs) + " |\n|" + "---|" * (len(figs) + 1))
        for view, m in g.mean().iterrows():
            sd = g.std().loc[view]
            echo(f"| {view} | " + " | ".join(f"{m[f]:.3f} ± {sd[f]:.3f}" for f in figs) + " |")
        echo("")
    cols = ["view", "repeat", "ok", "slo_attainment", "ontime_utility_hat", "ttft_p50_ms", "ttft_p99_ms", "est_err_median_ms",
            "est_abs_err_median_ms", "mean_view_age_ms", "shares"]
    echo("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for _, r in df.iterrows():
        cells = [f"{r[c]:.3f}" if isinstance(r[c], float | np.floating) else str(r[c]) for c in cols]
        echo("| " + " | ".join(cells) + " |")
