"""The router figures of a report: OnTimeUtility and SLO attainment vs
arrival rate (one line per router, delta and lambda cell, labelled with its
own AUC), the utility-TTFT frontier over deltas, where each router sends
requests, and the TTFT CDF of replays. Captions state what the data shows:
best and worst line, and whether the gap between them grows."""
from __future__ import annotations

import numpy as np
import pandas as pd

from reports.colours import Palette
from reports.spec import DASHES, FigureSpec, Panel, Series, fmt_delta
from reports.sweep_cells import cell_auc, cell_label, delta_routers, sweep_cells, sweeps


def _vs_rate(results, pal, metric: str, ylabel: str, scale: float, with_auc: bool) -> list[Panel]:
    panels = []
    for r in sweeps(results, min_rates=2):
        cells = sweep_cells(r)
        n_lams = cells["lam"].nunique()
        series = []
        for router, rg in cells.groupby("router", sort=False):
            for i, ((delta, lam), g) in enumerate(rg.groupby(["delta_per_us", "lam"], dropna=False)):
                g = g.sort_values("rate")
                if g["rate"].nunique() < 2:
                    continue
                label = cell_label(router, delta, lam, r, n_lams)
                if with_auc:
                    auc = cell_auc(r, router, delta, lam)
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
    pts = [(r, p) for r in sweeps(results) for p in r.metrics.get("frontier", [])]
    if not pts:
        return None
    df = pd.DataFrame([{**p, "label": r.label} for r, p in pts])
    series = []
    for (_lbl, router, rate), g in df.groupby(["label", "router", "rate"]):
        g = g.sort_values("ttft_mean_s")
        series.append(Series(f"{router} @ {rate:g} q/s (labels: δ per µs)", g["ttft_mean_s"].tolist(),
                             g["mean_utility"].tolist(), pal(router), text=[fmt_delta(d) for d in g["delta_per_us"]],
                             group=router))
    rates = set(df["rate"])
    for r in sweeps(results):
        cells = sweep_cells(r)
        other = cells[~cells["router"].isin(delta_routers(r)) & cells["rate"].isin(rates)]
        for _, row in other.iterrows():
            series.append(Series(f"{row['router']} @ {row['rate']:g} q/s", [row["ttft_mean_s"]], [row["mean_utility"]],
                                 pal(row["router"]), mode="markers", group=row["router"]))
    best = df.loc[df["mean_utility"].idxmax()]
    fastest = df.loc[df["ttft_mean_s"].idxmin()]
    cap = (f"Mean realised utility vs mean TTFT as the soft rule's δ varies (point labels, utility per µs); single "
           f"points are the other routers at the same rate. Highest utility at δ={fmt_delta(best['delta_per_us'])} "
           f"({best['mean_utility']:.3f}), lowest mean TTFT at δ={fmt_delta(fastest['delta_per_us'])} "
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
            soft = delta_routers(r)
            for (router, delta), g in top.groupby(["router", "delta_per_us"]):
                label = router + (f" δ={fmt_delta(delta)}" if router in soft else "")
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
