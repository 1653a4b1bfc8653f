"""The estimator figures of a report: estimated vs measured TTFT, the APE
CDF, MAPE by load and by the prompt's cached share, and the reliability of
the TTFT distributions. Errors that span decades go on log axes; captions
state what the data shows."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd

from reports.spec import DASHES, FigureSpec, Panel, Series

APE_FLOOR = 1e-4  # APEs below 0.01% are drawn at 0.01% on the log axis (the caption says how many)


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
    if not series:  # no estimator has a measurable APE (every true TTFT <= 0 or every estimate missing)
        return None
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


def share_bin_order(label: str) -> tuple[float, float]:
    """Order of a cached-share bin as the result names it ("0%", "0-25%",
    ..., "75-100%"): by its bounds, the exact "0%" first."""
    nums = [float(x) for x in re.findall(r"[\d.]+", label)] or [float("inf")]
    return (nums[0], nums[-1] if len(nums) > 1 else -1.0)


def error_by_cached_share(results, pal_est) -> FigureSpec | None:
    """TTFT error by the share of the prompt the prefix cache served
    (recorded): an estimator or twin blind to the cache is off by that share,
    so its error grows with it; one that models the cache stays flat."""
    series, spans = [], []
    for i, r in enumerate(results):  # one colour per estimator, one dash per result
        if r.kind == "estimate":
            blocks = [(n, s.get("by_cached_share") or {}) for n, s in r.metrics.get("estimators", {}).items()]
        elif r.kind == "validate":
            blocks = [("twin", (r.metrics.get("ttft") or {}).get("by_cached_share") or {})]
        else:
            continue
        for name, bins in blocks:
            keys = [k for k in sorted(bins, key=share_bin_order) if (bins.get(k) or {}).get("mape") is not None
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




def ttft_reliability(results, pal_est) -> FigureSpec | None:
    """Reliability diagram of TTFT distributions: per estimate
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
