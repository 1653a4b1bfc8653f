"""Error metrics shared by batch-time and TTFT evaluation."""
from __future__ import annotations

import numpy as np
import pandas as pd


def ape(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Absolute percentage error |pred - true| / true, per element."""
    true = np.asarray(true, dtype=np.float64)
    return np.abs(np.asarray(pred, dtype=np.float64) - true) / true


def mape(pred: np.ndarray, true: np.ndarray) -> float:
    return float(np.mean(ape(pred, true))) if len(true) else float("nan")


def r_squared(pred: np.ndarray, true: np.ndarray) -> float:
    true = np.asarray(true, dtype=np.float64)
    ss_tot = float(np.sum((true - true.mean()) ** 2))
    return 1.0 - float(np.sum((true - pred) ** 2)) / ss_tot if ss_tot > 0 else float("nan")


def error_summary(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """MAPE, median/p90/p99 APE, R^2 and n."""
    e = ape(pred, true)
    if e.size == 0:
        return {"n": 0}
    return {"n": int(e.size), "mape": float(e.mean()), "median_ape": float(np.median(e)),
            "p90_ape": float(np.percentile(e, 90)), "p99_ape": float(np.percentile(e, 99)),
            "r2": r_squared(pred, true)}


CACHED_SHARE_EDGES = (0.25, 0.5, 0.75)
CACHED_SHARE_LABELS = ("0%", "0-25%", "25-50%", "50-75%", "75-100%")


def cached_share_bin(share: np.ndarray) -> np.ndarray:
    """Bins of the share of a request's prompt served from the prefix cache
    (recorded ``cached_tokens`` / ``prompt_tokens``): "0%" alone, because a
    cold request and a 10% hit behave differently; NaN (unknown) -> ""."""
    share = np.asarray(share, dtype=np.float64)
    labels = np.array(CACHED_SHARE_LABELS[1:])[np.searchsorted(np.array(CACHED_SHARE_EDGES), share, side="left")]
    return np.where(np.isnan(share), "", np.where(share <= 0, CACHED_SHARE_LABELS[0], labels))


def error_by_cached_share(est: np.ndarray, true: np.ndarray, share: np.ndarray) -> dict:
    """MAPE (and n) per cached-share bin, in bin order; {} when no share is known."""
    bins = cached_share_bin(share)
    out = {}
    for label in CACHED_SHARE_LABELS:
        m = bins == label
        if m.any():
            e = error_summary(est[m], true[m])
            out[label] = {k: e.get(k) for k in ("n", "mape", "median_ape", "p90_ape")}
    return out


def pinball(g: pd.DataFrame) -> dict:
    """Mean pinball (quantile) loss, in seconds, of the predicted p50 and
    p90: tau (y - q) when the truth y is above the quantile q, (1 - tau) (q - y)
    below; lower is better, and unlike coverage it charges how far off a quantile is."""
    out = {}
    true = g["true_s"].to_numpy(dtype=np.float64)
    for lv, tau in (("p50", 0.5), ("p90", 0.9)):
        q = g[f"{lv}_s"].to_numpy(dtype=np.float64)
        m = np.isfinite(q) & np.isfinite(true)
        d = true[m] - q[m]
        out[lv] = float(np.mean(np.where(d >= 0, tau * d, (tau - 1.0) * d))) if m.any() else None
    return out


def coverage(g: pd.DataFrame) -> dict | None:
    """Share of measured TTFTs at or below the predicted p50, p90, p99
    (nominal 0.5, 0.9, 0.99), for an estimator that gives a distribution;
    None for a point estimator."""
    if "p50_s" not in g or not g["p50_s"].notna().any():
        return None
    m = g["p50_s"].notna() & np.isfinite(g["p50_s"])
    true = g["true_s"][m].to_numpy()
    return {"n": int(m.sum()), **{lv: float(np.mean(true <= g[f"{lv}_s"][m].to_numpy()))
                                  for lv in ("p50", "p90", "p99")}}


def coinciding_quantiles(est: pd.DataFrame) -> set[str]:
    """Estimators whose predicted p50 and p99 are the same on every request
    (no spread: a profile without a noise model), so that their coverage
    shares are one number."""
    if "p50_s" not in est:
        return set()
    out = set()
    for name, g in est.groupby("estimator", sort=False):
        p50, p99 = g["p50_s"].to_numpy(dtype=np.float64), g["p99_s"].to_numpy(dtype=np.float64)
        m = np.isfinite(p50)
        if m.any() and np.array_equal(p50[m], p99[m]):
            out.add(str(name))
    return out
