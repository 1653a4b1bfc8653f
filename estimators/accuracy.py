"""Error metrics shared by batch-time and TTFT evaluation."""
from __future__ import annotations

import numpy as np


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
