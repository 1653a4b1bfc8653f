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
