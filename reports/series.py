"""What each report figure shows, as data: panels of named series with their
colours, scales and markers, and a caption computed from the numbers.

Both renderers draw from these specs (Matplotlib for the static PNGs,
Plotly for the interactive page), so the two can never disagree, and the
tests check the figures' content without reading pixels.

Rules every figure follows:
- one colour per router (and per estimator) across every figure of a
  report (``Palette``); a soft router's deltas differ by dash, not colour;
- a sweep's lines are per (router, delta, lambda) cell, each labelled with
  its own AUC;
- results with the same folder name are told apart by their parent folders;
- errors that span decades go on log axes, and captions state what the
  data shows, never a fixed claim.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from reports.results import Result

# Tableau 10 then its light variants: distinct hues for up to 20 routers.
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
          "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#c7c7c7",
          "#dbdb8d", "#9edae5"]
DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]
APE_FLOOR = 1e-4  # APEs below 0.01% are drawn at 0.01% on the log axis (the caption says how many)


@dataclass
class Series:
    label: str
    x: list
    y: list
    color: str
    mode: str = "lines+markers"  # lines | lines+markers | markers | barh
    dash: str = "solid"
    band: tuple[list, list] | None = None  # (low, high): a 95% interval over seeds
    text: list[str] | None = None  # per-point labels drawn next to the points
    group: str = ""  # what the series belongs to (router or estimator), for toggling


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    xlog: bool = False
    ylog: bool = False
    equal: bool = False  # same range on both axes, square panel
    diagonal: bool = False  # the y = x line
    vlines: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class FigureSpec:
    name: str  # file stem: <name>.png, and the plot element's id in the interactive page
    caption: str
    panels: list[Panel]


class Palette:
    """A fixed colour per name: registry routers in registry order first, so
    a router keeps its colour across reports too; other names after them."""

    def __init__(self, names):
        try:
            from routers.registry import ROUTERS
        except Exception:  # a report must not fail because the registry cannot load
            ROUTERS = []
        known = [n for n in ROUTERS]
        extra = sorted(set(names) - set(known))
        self.order = known + extra

    def __call__(self, name: str) -> str:
        if name not in self.order:
            self.order.append(name)
        return COLORS[self.order.index(name) % len(COLORS)]


def assign_labels(results: list[Result]) -> None:
    """Give each result the shortest trailing part of its path that no other
    result shares (``a/sweep`` and ``b/sweep``, not two ``sweep``)."""
    parts = [r.path.resolve().parts for r in results]
    for i, r in enumerate(results):
        depth = 1
        while depth < len(parts[i]) and any(
                j != i and parts[j][-depth:] == parts[i][-depth:] for j in range(len(results))):
            depth += 1
        r.display = "/".join(parts[i][-depth:])


def _fmt_delta(d: float) -> str:
    return f"{d:g}"


# -- estimates --------------------------------------------------------------

def _estimates(results):
    return [(r.label, r.tables["estimates"]) for r in results if r.kind == "estimate" and "estimates" in r.tables]


def _ape(df: pd.DataFrame) -> np.ndarray:
    ok = np.isfinite(df["est_s"]) & (df["true_s"] > 0)
    return (np.abs(df["est_s"][ok] - df["true_s"][ok]) / df["true_s"][ok]).to_numpy()


def estimate_scatter(results, pal_est) -> FigureSpec | None:
    est = _estimates(results)
    if not est:
        return None
    names = sorted({n for _, df in est for n in df["estimator"].unique()})
    panels = []
    for name in names:
        series, mapes = [], []
        for label, df in est:
            g = df[(df["estimator"] == name) & np.isfinite(df["est_s"]) & (df["est_s"] > 0) & (df["true_s"] > 0)]
            mape = float(np.mean(_ape(df[df["estimator"] == name]))) if len(g) else float("nan")
            mapes.append((label, mape))
            series.append(Series(label if len(est) > 1 else name, g["true_s"].tolist(), g["est_s"].tolist(),
                                 pal_est(name), mode="markers", group=name))
        mape_txt = ", ".join(f"{100 * m:.1f}%" for _, m in mapes)
        panels.append(Panel(f"{name} (MAPE {mape_txt})", "true TTFT (s)", "estimated TTFT (s)", series,
                            xlog=True, ylog=True, equal=True, diagonal=True))
    first = est[0][1]
    best = min(((n, float(np.mean(_ape(first[first["estimator"] == n])))) for n in names), key=lambda t: t[1])
    return FigureSpec("estimate_scatter", "Estimated vs measured TTFT per estimator, equal log axes with the "
                      f"diagonal (exact): points above it over-estimate. Lowest MAPE: {best[0]} "
                      f"({100 * best[1]:.1f}%).", panels)


def ape_cdf(results, pal_est) -> FigureSpec | None:
    est = _estimates(results)
    if not est:
        return None
    series, floored, medians = [], 0, []
    for label, df in est:
        for name, g in df.groupby("estimator"):
            ape = np.sort(_ape(g))
            if not len(ape):
                continue
            floored += int((ape < APE_FLOOR).sum())
            medians.append((name, float(np.median(ape))))
            series.append(Series(name + (f" ({label})" if len(est) > 1 else ""), np.maximum(ape, APE_FLOOR).tolist(),
                                 (np.arange(1, len(ape) + 1) / len(ape)).tolist(), pal_est(name), mode="lines",
                                 group=name))
    best = min(medians, key=lambda t: t[1])
    cap = (f"CDF of TTFT absolute percentage error per estimator on a log axis: further left is better. "
           f"Lowest median APE: {best[0]} ({100 * best[1]:.2f}%).")
    if floored:
        cap += f" {floored} APEs below {100 * APE_FLOOR:g}% are drawn at {100 * APE_FLOOR:g}%."
    return FigureSpec("ape_cdf", cap, [Panel("", "absolute percentage error (fraction)", "share of requests",
                                             series, xlog=True)])


def mape_by_load(results, pal_est) -> FigureSpec | None:
    ms = [(r.label, r.metrics) for r in results if r.kind == "estimate"]
    if not ms:
        return None
    series, worst = [], None
    for label, m in ms:
        for name, s in m["estimators"].items():
            bins = s.get("by_load", {})
            keys = [k for k in bins if bins[k].get("mape") is not None and bins[k]["mape"] > 0]
            ys = [100 * bins[k]["mape"] for k in keys]
            if not keys:
                continue
            series.append(Series(name + (f" ({label})" if len(ms) > 1 else ""), keys, ys, pal_est(name), group=name))
            i = int(np.argmax(ys))
            if worst is None or ys[i] > worst[2]:
                worst = (name, keys[i], ys[i])
    if not series:
        return None
    cap = "TTFT MAPE by the number of residents on the instance at arrival, log scale (errors span decades)."
    if worst:
        cap += f" Largest: {worst[0]} at {worst[1]} residents ({worst[2]:,.0f}%)."
    return FigureSpec("mape_by_load", cap, [Panel("", "residents on the instance at arrival", "MAPE (%)", series,
                                                  ylog=True)])


def error_by_cached_share(results, pal_est) -> FigureSpec | None:
    """TTFT error by the share of the prompt the prefix cache served
    (recorded): an estimator or twin blind to the cache is off by that share,
    so its error grows with it; one that models the cache stays flat."""
    from estimators.accuracy import CACHED_SHARE_LABELS

    series, spans = [], []
    for i, r in enumerate(results):  # one colour per estimator, one dash per result
        if r.kind == "estimate":
            blocks = [(n, s.get("by_cached_share") or {}) for n, s in r.metrics.get("estimators", {}).items()]
        elif r.kind == "validate":
            blocks = [("twin", (r.metrics.get("ttft") or {}).get("by_cached_share") or {})]
        else:
            continue
        for name, bins in blocks:
            keys = [k for k in CACHED_SHARE_LABELS if (bins.get(k) or {}).get("mape") is not None
                    and bins[k]["mape"] > 0]
            if not keys:
                continue
            ys = [100 * bins[k]["mape"] for k in keys]
            series.append(Series(f"{name} ({r.label})" if len(results) > 1 else name, keys, ys,
                                 pal_est(name), dash=DASHES[i % len(DASHES)], group=name))
            spans.append((series[-1].label, ys[0], ys[-1], keys[0], keys[-1]))
    if not series:
        return None
    cap = ("TTFT MAPE by the share of the prompt served from the prefix cache (recorded), log scale: "
           "a cache-blind estimate's error grows with the share.")
    worst = max(spans, key=lambda t: t[2] / t[1] if t[1] > 0 else 0.0)
    cap += (f" Steepest: {worst[0]}, {worst[1]:,.1f}% at {worst[3]} to {worst[2]:,.1f}% at {worst[4]}.")
    return FigureSpec("error_by_cached_share", cap, [Panel("", "share of the prompt from the prefix cache",
                                                           "MAPE (%)", series, ylog=True)])


# -- sweeps -----------------------------------------------------------------

def _delta_routers(r: Result) -> set[str]:
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
    lam = "lam" if "lam" in df.columns else None
    keys = ["router", "delta_per_us"] + ([lam] if lam else []) + ["rate"]
    metrics = [c for c in ("ontime_utility", "slo_attainment", "mean_utility", "ttft_mean_s", "ttft_p90_s")
               if c in df.columns]
    out = df.groupby(keys, as_index=False)[metrics].mean()
    for m in ("ontime_utility", "slo_attainment"):
        if m in df.columns:
            out[f"{m}_half_ci"] = df.groupby(keys)[m].apply(lambda x: _half_ci(x.to_numpy())).to_numpy()
    if not lam:
        out["lam"] = np.nan
    return out


def _cell_label(router: str, delta: float, lam: float, r: Result, n_lams: int) -> str:
    label = router
    if router in _delta_routers(r):
        label += f" δ={_fmt_delta(delta)}"
    if n_lams > 1 and lam == lam:
        label += f" λ={lam:g}"
    return label


def _cell_auc(r: Result, router: str, delta: float, lam: float) -> float | None:
    """The AUC the sweep recorded for exactly this (router, delta, lambda) cell."""
    for v in r.metrics.get("routers", {}).values():
        if v.get("router") == router and np.isclose(v.get("delta_per_us", 0.0), delta) and (
                lam != lam or v.get("lambda") is None or np.isclose(v["lambda"], lam)):
            return v.get("auc_ontime_utility")
    return None


def _sweeps(results, min_rates: int = 1):
    return [r for r in results if r.kind == "sweep" and "results" in r.tables
            and r.tables["results"]["rate"].nunique() >= min_rates]


def _vs_rate(results, pal, metric: str, ylabel: str, scale: float, with_auc: bool) -> list[Panel]:
    panels = []
    for r in _sweeps(results, min_rates=2):
        cells = sweep_cells(r)
        n_lams = cells["lam"].nunique()
        series = []
        for router, rg in cells.groupby("router", sort=False):
            for i, ((delta, lam), g) in enumerate(rg.groupby(["delta_per_us", "lam"], dropna=False)):
                g = g.sort_values("rate")
                if g["rate"].nunique() < 2:
                    continue
                label = _cell_label(router, delta, lam, r, n_lams)
                if with_auc:
                    auc = _cell_auc(r, router, delta, lam)
                    label += f" (AUC {auc:.3f})" if auc is not None else ""
                half = g[f"{metric}_half_ci"].to_numpy() if f"{metric}_half_ci" in g else np.zeros(len(g))
                y = scale * g[metric].to_numpy()
                band = ((y - scale * half).tolist(), (y + scale * half).tolist()) if (half > 0).any() else None
                series.append(Series(label, g["rate"].tolist(), y.tolist(), pal(router), dash=DASHES[i % len(DASHES)],
                                     band=band, group=router))
        rr = r.metrics.get("rate_range", [])
        title = f"{r.label} ({r.metrics.get('arrival', '')}, rates {rr[0]:g}-{rr[-1]:g})" if rr else r.label
        panels.append(Panel(title, "arrival rate (q/s)", ylabel, series))
    return panels


def _gap_sentence(panels: list[Panel], unit: str = "", fmt: str = "{:.3f}") -> str:
    """Best and worst line at the lowest and highest rate, and whether the
    gap between them grows: stated from the data, per sweep."""
    out = []
    for p in panels:
        if len(p.series) < 2:
            continue
        rates = sorted({x for s in p.series for x in s.x})
        lo, hi = rates[0], rates[-1]

        def at(rate, p=p):
            vals = [(s.label, s.y[s.x.index(rate)]) for s in p.series if rate in s.x]
            return max(vals, key=lambda t: t[1]), min(vals, key=lambda t: t[1])

        (b_lo, w_lo), (b_hi, w_hi) = at(lo), at(hi)
        gap_lo, gap_hi = b_lo[1] - w_lo[1], b_hi[1] - w_hi[1]
        trend = "widens" if gap_hi > gap_lo * 1.05 else "narrows" if gap_hi < gap_lo * 0.95 else "stays about the same"
        f = fmt.format
        out.append(f"{p.title}: at {hi:g} q/s best {b_hi[0]} ({f(b_hi[1])}{unit}), worst {w_hi[0]} "
                   f"({f(w_hi[1])}{unit}); the best-worst gap {trend} from {lo:g} to {hi:g} q/s "
                   f"({f(gap_lo)} -> {f(gap_hi)}{unit}).")
    return " ".join(out)


def ontime_vs_rate(results, pal) -> FigureSpec | None:
    panels = _vs_rate(results, pal, "ontime_utility", "OnTimeUtility", 1.0, with_auc=True)
    if not panels:
        return None
    cap = ("OnTimeUtility vs arrival rate per (router, δ, λ) cell, its AUC over the swept rates in the legend "
           "(bands: 95% interval over seeds). " + _gap_sentence(panels))
    return FigureSpec("ontime_utility_vs_rate", cap.strip(), panels)


def attainment_vs_rate(results, pal) -> FigureSpec | None:
    panels = _vs_rate(results, pal, "slo_attainment", "SLO attainment (%)", 100.0, with_auc=False)
    if not panels:
        return None
    cap = "Share of requests whose TTFT met their SLO, per router cell and arrival rate. " + _gap_sentence(
        panels, "%", "{:.1f}")
    return FigureSpec("slo_attainment_vs_rate", cap.strip(), panels)


def frontier(results, pal) -> FigureSpec | None:
    pts = [(r, p) for r in _sweeps(results) for p in r.metrics.get("frontier", [])]
    if not pts:
        return None
    df = pd.DataFrame([{**p, "label": r.label} for r, p in pts])
    series = []
    for (_lbl, router, rate), g in df.groupby(["label", "router", "rate"]):
        g = g.sort_values("ttft_mean_s")
        series.append(Series(f"{router} @ {rate:g} q/s (labels: δ per µs)", g["ttft_mean_s"].tolist(),
                             g["mean_utility"].tolist(), pal(router), text=[_fmt_delta(d) for d in g["delta_per_us"]],
                             group=router))
    rates = set(df["rate"])
    for r in _sweeps(results):
        cells = sweep_cells(r)
        other = cells[~cells["router"].isin(_delta_routers(r)) & cells["rate"].isin(rates)]
        for _, row in other.iterrows():
            series.append(Series(f"{row['router']} @ {row['rate']:g} q/s", [row["ttft_mean_s"]], [row["mean_utility"]],
                                 pal(row["router"]), mode="markers", group=row["router"]))
    best = df.loc[df["mean_utility"].idxmax()]
    fastest = df.loc[df["ttft_mean_s"].idxmin()]
    cap = (f"Mean realised utility vs mean TTFT as the soft rule's δ varies (point labels, utility per µs); single "
           f"points are the other routers at the same rate. Highest utility at δ={_fmt_delta(best['delta_per_us'])} "
           f"({best['mean_utility']:.3f}), lowest mean TTFT at δ={_fmt_delta(fastest['delta_per_us'])} "
           f"({fastest['ttft_mean_s']:.3f} s).")
    return FigureSpec("utility_ttft_frontier", cap, [Panel("", "mean TTFT (s)", "mean realised utility", series,
                                                           xlog=True)])


def composition(results, pal) -> FigureSpec | None:
    rows, task_rows = [], []
    for r in results:
        if r.kind == "replay":
            name = r.metrics.get("router", r.label)
            rows.append((name, r.metrics.get("share_by_instance", {})))
            for task, shares in sorted(r.metrics.get("share_by_task", {}).items()):
                task_rows.append((f"{name}: {task}", shares))
        elif r.kind == "sweep" and "results" in r.tables and r.tables["results"]["rate"].nunique() >= 2:
            df = r.tables["results"]
            share_cols = [c for c in df.columns if c.startswith("share_")]
            top = df[df["rate"] == df["rate"].max()]
            soft = _delta_routers(r)
            for (router, delta), g in top.groupby(["router", "delta_per_us"]):
                label = router + (f" δ={_fmt_delta(delta)}" if router in soft else "")
                rows.append((f"{label} @ {g['rate'].iloc[0]:g} q/s ({r.label})",
                             {c[6:]: float(g[c].mean()) for c in share_cols}))
    if not rows:
        return None
    insts = sorted({k for _, d in rows + task_rows for k in d})
    ipal = Palette(insts)
    ipal.order = insts  # instances get their own colours, in name order
    panels = []
    for title, prow in [("by router", rows)] + ([("by router and task", task_rows)] if task_rows else []):
        series = [Series(inst, [100 * d.get(inst, 0.0) for _, d in prow], [lbl for lbl, _ in prow], ipal(inst),
                         mode="barh", group=inst) for inst in insts]
        panels.append(Panel(title, "share of requests (%)", "", series))
    top = "; ".join(f"{lbl}: {max(d, key=d.get)} {100 * max(d.values()):.0f}%" for lbl, d in rows if d)
    return FigureSpec("routing_composition", "Where each router sends requests, per instance (sweeps at their "
                      f"highest rate). Largest share per row: {top}.", panels)


def ttft_cdf(results, pal) -> FigureSpec | None:
    reps = [r for r in results if r.kind == "replay" and "requests" in r.tables]
    if not reps:
        return None
    series, slos, within = [], [], []
    for r in reps:
        req = r.tables["requests"]
        t = np.sort(req["ttft_s"].dropna().to_numpy())
        router = r.metrics.get("router", r.label)
        series.append(Series(router, t.tolist(), (np.arange(1, len(t) + 1) / len(t)).tolist(), pal(router),
                             mode="lines", group=router))
        if "slo_ttft_s" in req.columns and req["slo_ttft_s"].notna().any():
            slos.append(req["slo_ttft_s"].dropna().to_numpy())
            ok = req["ttft_s"].notna() & req["slo_ttft_s"].notna()
            within.append((router, float((req["ttft_s"][ok] <= req["slo_ttft_s"][ok]).mean())))
    vlines, cap = [], "TTFT CDF per router (log axis): the tail on the right is what misses SLOs."
    if slos:
        allslo = np.concatenate(slos)
        med = float(np.median(allslo))
        vlines.append((med, f"median SLO {med:.3g} s"))
        if allslo.min() != allslo.max():
            vlines.append((float(np.percentile(allslo, 90)), f"p90 SLO {np.percentile(allslo, 90):.3g} s"))
        cap += (" Dashed lines: the per-request SLOs' median" + (" and p90" if len(vlines) > 1 else "") + ". Met: "
                + ", ".join(f"{n} {100 * w:.1f}%" for n, w in within) + ".")
    return FigureSpec("ttft_cdf", cap, [Panel("", "TTFT (s)", "share of requests", series, xlog=True, vlines=vlines)])


def ttft_reliability(results, pal_est) -> FigureSpec | None:
    """Reliability diagram of TTFT distributions (issue 16): per estimate
    result and estimator with predicted quantiles, the share of measured
    TTFTs below each predicted quantile against its nominal level."""
    levels = (("p50_s", 0.5), ("p90_s", 0.9), ("p99_s", 0.99))
    est = _estimates(results)
    series, worst = [], None
    for label, df in est:
        if "p50_s" not in df:
            continue
        for name, g in df.groupby("estimator"):
            g = g[np.isfinite(g["p50_s"])]
            if not len(g):
                continue
            shares = [float(np.mean(g["true_s"] <= g[c])) for c, _ in levels]
            series.append(Series(name + (f" ({label})" if len(est) > 1 else ""), [lv for _, lv in levels], shares,
                                 pal_est(name), group=name))
            off = max(abs(sh - lv) for sh, (_, lv) in zip(shares, levels))
            if worst is None or off > worst[1]:
                worst = (series[-1].label, off)
    if not series:
        return None
    series.insert(0, Series("calibrated", [0.4, 1.0], [0.4, 1.0], "#000000", mode="lines", dash="dot"))
    cap = (f"Reliability of the TTFT distribution: share of measured TTFTs below the predicted p50, p90 and p99 "
           f"against the nominal level (on the dotted diagonal the distribution is calibrated; below it TTFTs run "
           f"longer than predicted). Largest miss: {worst[0]}, {100 * worst[1]:.1f} points.")
    return FigureSpec("ttft_reliability", cap, [Panel("", "nominal quantile level", "share of measured TTFTs below it",
                                                      series)])


ROUTER_FIGURES = (ontime_vs_rate, attainment_vs_rate, frontier, composition, ttft_cdf)
ESTIMATOR_FIGURES = (estimate_scatter, ape_cdf, mape_by_load, error_by_cached_share, ttft_reliability)


def figure_specs(results: list[Result]) -> list[FigureSpec]:
    """Every figure the results hold data for, in report order, with one
    palette for routers and one for estimators shared by all figures."""
    routers = set()
    for r in results:
        if r.kind == "sweep" and "results" in r.tables:
            routers |= set(r.tables["results"]["router"])
        elif r.kind == "replay":
            routers.add(r.metrics.get("router", r.label))
    estimators = sorted({n for r in results if r.kind == "estimate" for n in r.metrics.get("estimators", {})})
    pal, pal_est = Palette(routers), Palette([])
    pal_est.order = estimators
    specs = [fn(results, pal_est) for fn in ESTIMATOR_FIGURES] + [fn(results, pal) for fn in ROUTER_FIGURES]
    return [s for s in specs if s is not None]


def png_name(spec: FigureSpec) -> str:
    return f"{spec.name}.png"


