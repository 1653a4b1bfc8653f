"""The report's figures (Matplotlib, Agg backend). Each function draws one
figure from the loaded results and returns its caption, or None when the
results hold nothing to draw."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from reports.results import Result  # noqa: E402


def _finish(ax, xlabel: str, ylabel: str, legend: bool = True) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if legend:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _estimates(results: list[Result]) -> list[tuple[str, pd.DataFrame]]:
    return [(r.label, r.tables["estimates"]) for r in results if r.kind == "estimate"]


def _sweeps(results: list[Result], min_rates: int = 1) -> list[Result]:
    return [r for r in results if r.kind == "sweep" and r.tables["results"]["rate"].nunique() >= min_rates]


def scatter_est_vs_true(results: list[Result], path: Path) -> str | None:
    est = _estimates(results)
    if not est:
        return None
    names = sorted({n for _, df in est for n in df["estimator"].unique()})
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        for label, df in est:
            g = df[(df["estimator"] == name) & np.isfinite(df["est_s"]) & (df["est_s"] > 0)]
            ax.scatter(g["true_s"], g["est_s"], s=4, alpha=0.4, label=label if len(est) > 1 else None)
        lo = max(1e-4, min(df["true_s"].min() for _, df in est))
        hi = max(df["true_s"].max() for _, df in est)
        ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("true TTFT (s)")
        ax.set_ylabel("estimated TTFT (s)")
    if len(est) > 1:
        axes[0][0].legend(fontsize=7)
    _save(fig, path)
    return "Estimated vs measured TTFT per estimator (log axes): points on the diagonal are exact; a cloud above it over-estimates."


def ape_cdf(results: list[Result], path: Path) -> str | None:
    est = _estimates(results)
    if not est:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, df in est:
        for name, g in df.groupby("estimator"):
            ape = np.sort(np.abs(g["est_s"] - g["true_s"]) / g["true_s"])
            ax.plot(ape, np.arange(1, len(ape) + 1) / len(ape), label=f"{name}" + (f" ({label})" if len(est) > 1 else ""))
    ax.set_xscale("symlog", linthresh=0.01)
    _finish(ax, "absolute percentage error (fraction)", "share of requests")
    _save(fig, path)
    return "CDF of TTFT absolute percentage error per estimator: the further left and the steeper, the better."


def mape_by_load(results: list[Result], path: Path) -> str | None:
    ms = [(r.label, r.metrics) for r in results if r.kind == "estimate"]
    if not ms:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for label, m in ms:
        for name, s in m["estimators"].items():
            bins = s.get("by_load", {})
            keys = [k for k in bins if bins[k].get("mape") is not None]
            ax.plot(keys, [100 * bins[k]["mape"] for k in keys], marker="o",
                    label=name + (f" ({label})" if len(ms) > 1 else ""))
    _finish(ax, "residents on the instance at arrival", "MAPE (%)")
    _save(fig, path)
    return "TTFT MAPE by load at arrival: how each estimator's error grows with the number of resident requests."


def _delta_routers(r: Result) -> set[str]:
    """Routers whose decisions depend on delta, as the sweep recorded them."""
    return {n for n, c in r.metrics.get("router_capabilities", {}).items() if c.get("uses_delta")}


def _by_rate(r: Result, metric: str):
    df = r.tables["results"]
    soft = df["router"].isin(_delta_routers(r))
    base = df[~soft | (df["delta_per_us"] == df.groupby("router")["delta_per_us"].transform("min"))]
    return base.groupby(["router", "rate"], as_index=False)[metric].agg(
        **{metric: "mean", "half_ci": lambda x: _half_ci(x.to_numpy())})


def _half_ci(x) -> float:
    """Half-width of the 95% t-interval over seeds (0 with one seed)."""
    from harness.sweep_stats import mean_ci

    ci = mean_ci(x)["ci95"]
    return (ci[1] - ci[0]) / 2 if ci else 0.0


def _vs_rate(results: list[Result], path: Path, metric: str, ylabel: str, scale: float = 1.0,
             auc_key: str | None = None) -> bool:
    """One panel per sweep of ``metric`` against arrival rate, a line per
    router (with its AUC in the legend when ``auc_key`` is given)."""
    sw = _sweeps(results, min_rates=2)
    if not sw:
        return False
    fig, axes = plt.subplots(1, len(sw), figsize=(6.4 * len(sw), 4), squeeze=False)
    for ax, r in zip(axes[0], sw):
        aucs = {v["router"]: v[auc_key] for v in r.metrics.get("routers", {}).values()} if auc_key else {}
        for router, g in _by_rate(r, metric).groupby("router"):
            if g["rate"].nunique() < 2:
                continue
            label = f"{router} (AUC {aucs.get(router, float('nan')):.3f})" if auc_key else router
            line, = ax.plot(g["rate"], scale * g[metric], marker="o", label=label)
            if (g["half_ci"] > 0).any():  # several seeds: the 95% band over seeds
                ax.fill_between(g["rate"], scale * (g[metric] - g["half_ci"]), scale * (g[metric] + g["half_ci"]),
                                color=line.get_color(), alpha=0.2, linewidth=0)
        rr = r.metrics.get("rate_range", [])
        ax.set_title(f"{r.label} ({r.metrics.get('arrival', '')}, rates {rr[0]:g}-{rr[-1]:g})" if rr else r.label)
        _finish(ax, "arrival rate (q/s)", ylabel)
    _save(fig, path)
    return True


def ontime_vs_rate(results: list[Result], path: Path) -> str | None:
    if not _vs_rate(results, path, "ontime_utility", "OnTimeUtility", auc_key="auc_ontime_utility"):
        return None
    return "OnTimeUtility vs arrival rate per router, AUC over the swept rates in the legend: higher is better; the gap widens as load grows."


def attainment_vs_rate(results: list[Result], path: Path) -> str | None:
    if not _vs_rate(results, path, "slo_attainment", "SLO attainment (%)", scale=100.0):
        return None
    return "Share of requests whose TTFT met their SLO, per router and arrival rate."


def frontier(results: list[Result], path: Path) -> str | None:
    pts = [(r.label, p) for r in _sweeps(results) for p in r.metrics.get("frontier", [])]
    if not pts:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    df = pd.DataFrame([{**p, "label": lbl} for lbl, p in pts])
    for (_lbl, router, rate), g in df.groupby(["label", "router", "rate"]):
        g = g.sort_values("ttft_mean_s")
        ax.plot(g["ttft_mean_s"], g["mean_utility"], marker="o", label=f"{router} @ {rate:g} q/s")
        for _, row in g.iterrows():
            ax.annotate(f"{row['delta_per_us']:g}", (row["ttft_mean_s"], row["mean_utility"]), fontsize=6)
    for r in _sweeps(results):
        df2 = r.tables["results"]
        for _, row in df2[~df2["router"].isin(_delta_routers(r))].iterrows():
            if row["rate"] in set(df["rate"]):
                ax.scatter([row["ttft_mean_s"]], [row["mean_utility"]], marker="x")
                ax.annotate(row["router"], (row["ttft_mean_s"], row["mean_utility"]), fontsize=6)
    ax.set_xscale("log")
    _finish(ax, "mean TTFT (s)", "mean realised utility")
    _save(fig, path)
    return "Utility vs mean TTFT as the soft rule's delta (labels, utility per us) varies; crosses are other routers at the same rate."


def composition(results: list[Result], path: Path) -> str | None:
    rows, task_rows = [], []
    for r in results:
        if r.kind == "replay":
            name = r.metrics.get("router", r.label)
            rows.append((name, r.metrics.get("share_by_instance", {})))
            for task, shares in sorted(r.metrics.get("share_by_task", {}).items()):
                task_rows.append((f"{name}: {task}", shares))
        elif r.kind == "sweep" and r.tables["results"]["rate"].nunique() >= 2:
            df = r.tables["results"]
            share_cols = [c for c in df.columns if c.startswith("share_")]
            top = df[df["rate"] == df["rate"].max()]
            soft = _delta_routers(r)
            for (router, delta), g in top.groupby(["router", "delta_per_us"]):
                label = f"{router}" + (f"(delta={delta:g})" if router in soft else "")
                rows.append((f"{label} @ {g['rate'].iloc[0]:g} q/s", {c[6:]: float(g[c].mean()) for c in share_cols}))
    if not rows:
        return None
    panels = [("by router", rows)] + ([("by router and task", task_rows)] if task_rows else [])
    insts = sorted({k for _, d in rows + task_rows for k in d})
    height = max(len(p[1]) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 0.38 * height + 1.6), squeeze=False)
    for ax, (title, prow) in zip(axes[0], panels):
        left = np.zeros(len(prow))
        for inst in insts:
            vals = np.array([100 * d.get(inst, 0.0) for _, d in prow])
            ax.barh([lbl for lbl, _ in prow], vals, left=left, label=inst)
            left += vals
        ax.set_title(title)
        ax.set_xlabel("share of requests (%)")
        ax.tick_params(axis="y", labelsize=7)
    axes[0][0].legend(fontsize=7, loc="lower right")
    _save(fig, path)
    return ("Where each router sends requests, per instance and (replays) per task; sweeps at their highest rate: "
            "latency-agnostic piles onto one model, shortest-queue onto the fastest.")


def ttft_cdf(results: list[Result], path: Path) -> str | None:
    reps = [r for r in results if r.kind == "replay" and "requests" in r.tables]
    if not reps:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for r in reps:
        t = np.sort(r.tables["requests"]["ttft_s"].dropna().to_numpy())
        ax.plot(t, np.arange(1, len(t) + 1) / len(t), label=r.metrics.get("router", r.label))
    ax.set_xscale("log")
    _finish(ax, "TTFT (s)", "share of requests")
    _save(fig, path)
    return "TTFT CDF per router: the tail on the right is what misses SLOs."


def reliability(results: list[Result], path: Path) -> str | None:
    """Reliability diagram of TTFT distributions (issue 16): per estimate
    result and estimator with predicted quantiles, the share of measured
    TTFTs below each predicted quantile against its nominal level."""
    levels = (("p50_s", 0.5), ("p90_s", 0.9), ("p99_s", 0.99))
    curves = []
    for label, df in _estimates(results):
        if "p50_s" not in df:
            continue
        for name, g in df.groupby("estimator"):
            g = g[np.isfinite(g["p50_s"])]
            if len(g):
                curves.append((f"{name}" + (f" ({label})" if len(results) > 1 else ""),
                               [float(np.mean(g["true_s"] <= g[c])) for c, _ in levels]))
    if not curves:
        return None
    fig, ax = plt.subplots(figsize=(4.2, 4.0))
    nominal = [lv for _, lv in levels]
    ax.plot([0.4, 1.0], [0.4, 1.0], color="black", lw=0.8, label="calibrated")
    ax.fill_between([0.4, 1.0], [0.35, 0.95], [0.45, 1.05], color="grey", alpha=0.2, label="within 5 points")
    for label, shares in curves:
        ax.plot(nominal, shares, marker="o", label=label)
    ax.set_xlim(0.4, 1.0)
    ax.set_ylim(0.0, 1.0)
    _finish(ax, "nominal quantile level", "share of measured TTFTs below it")
    _save(fig, path)
    return ("Reliability of the TTFT distribution: share of measured TTFTs below the predicted p50, p90 and p99 "
            "against the nominal level; on the diagonal the distribution is calibrated, below it TTFTs run longer "
            "than predicted.")


FIGURES = [
    ("estimate_scatter.png", scatter_est_vs_true),
    ("ape_cdf.png", ape_cdf),
    ("mape_by_load.png", mape_by_load),
    ("ontime_utility_vs_rate.png", ontime_vs_rate),
    ("slo_attainment_vs_rate.png", attainment_vs_rate),
    ("utility_ttft_frontier.png", frontier),
    ("routing_composition.png", composition),
    ("ttft_cdf.png", ttft_cdf),
    ("ttft_reliability.png", reliability),
]
