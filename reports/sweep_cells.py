"""A sweep result's cells: per (router, delta, lambda, rate) the mean over
seeds of every metric and its 95% half-interval, and what the sweep
recorded of each router (which ones use delta) and each cell (its AUC)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from reports.results import Result
from reports.spec import fmt_delta


def delta_routers(r: Result) -> set[str]:
    """Routers whose decisions depend on delta, as the sweep recorded them."""
    return {n for n, c in r.metrics.get("router_capabilities", {}).items() if c.get("uses_delta")}


def _half_ci(x) -> float:
    """Half-width of the 95% t-interval over seeds (0 with one seed)."""
    from reports.paired_stats import mean_ci

    ci = mean_ci(x)["ci95"]
    return (ci[1] - ci[0]) / 2 if ci else 0.0


def sweep_cells(r: Result) -> pd.DataFrame:
    """Per (router, delta, lambda, rate): mean over seeds of every metric and
    the 95% half-interval of OnTimeUtility and SLO attainment."""
    df = r.tables["results"]
    if {"requests", "unserved", "slo_attainment", "serve_request_throughput__value"} <= set(df.columns):
        from reports.serving import cells_slo_goodput

        df = df.assign(slo_goodput=cells_slo_goodput(df))
    lam = "lam" if "lam" in df.columns else None
    keys = ["router", "delta_per_us"] + ([lam] if lam else []) + ["rate"]
    metrics = [c for c in ("ontime_utility", "slo_attainment", "mean_utility", "ttft_mean_s", "ttft_p90_s",
                           "slo_goodput") if c in df.columns]
    out = df.groupby(keys, as_index=False)[metrics].mean()
    for m in ("ontime_utility", "slo_attainment"):
        if m in df.columns:
            out[f"{m}_half_ci"] = df.groupby(keys)[m].apply(lambda x: _half_ci(x.to_numpy())).to_numpy()
    if not lam:
        out["lam"] = np.nan
    return out


def cell_label(router: str, delta: float, lam: float, r: Result, n_lams: int) -> str:
    label = router
    if router in delta_routers(r):
        label += f" δ={fmt_delta(delta)}"
    if n_lams > 1 and lam == lam:
        label += f" λ={lam:g}"
    return label


def cell_auc(r: Result, router: str, delta: float, lam: float) -> float | None:
    """The AUC the sweep recorded for exactly this (router, delta, lambda) cell."""
    for v in r.metrics.get("routers", {}).values():
        if v.get("router") == router and np.isclose(v.get("delta_per_us", 0.0), delta) and (
                lam != lam or v.get("lambda") is None or np.isclose(v["lambda"], lam)):
            return v.get("auc_ontime_utility")
    return None


def sweeps(results, min_rates: int = 1):
    return [r for r in results if r.kind == "sweep" and "results" in r.tables
            and r.tables["results"]["rate"].nunique() >= min_rates]
