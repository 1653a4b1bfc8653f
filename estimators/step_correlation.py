"""Correlated step-time noise: how much of a trajectory's noise is shared
by its steps, measured on the calibration steps, for SFS's TTFT
distribution (``estimators.sfs_dist``).

Why: the noise model draws each step's ratio actual/typical independently,
so the spread of a sum of n steps shrinks like 1/sqrt(n). Real steps do not
behave so: on the vllm_cpu recordings the log ratio of consecutive steps is
correlated 0.65-0.9 (lag 1) and still 0.2-0.5 twenty steps apart (the
host's state: frequency, cache and memory contention, the batch mix's
misfit, change slowly). A TTFT of a few steps then has nearly the spread of
one step, and the independent model's p90 is far too narrow.

What is carried: for a trajectory of n steps, the variance of the mean log
ratio beyond what independent steps give,
``common_var(n) = 2/n^2 * sum_{j=1}^{n-1} (n - j) * acov(j)``, with acov
the autocovariance of the (clipped, as ``online_speed``) log ratios over the
calibration steps in step order. The distribution multiplies the
trajectory's random part by a lognormal factor of mean 1 and that log
variance: the mean is unchanged, the spread of a short trajectory grows by
what its steps share. It is kept at grid points of n (``GRID``), linear in
between; past the grid it falls like 1/n (short-range correlation).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

GRID = np.array([1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256], dtype=np.float64)
MAX_LAG = int(GRID[-1])
MIN_STEPS = 4 * MAX_LAG  # fewer calibration steps: no correlation carried (acov at long lags too noisy)


def common_var_table(acov: np.ndarray) -> np.ndarray:
    """``common_var(n)`` at the ``GRID`` points from autocovariances
    ``acov[0..MAX_LAG]``; never negative."""
    out = np.zeros(GRID.size)
    for i, n in enumerate(GRID.astype(int)):
        j = np.arange(1, n)
        out[i] = max(0.0, 2.0 * float(np.sum((n - j) * acov[1:n])) / (n * n))
    return out


def autocovariance(log_ratios: list[np.ndarray], max_lag: int = MAX_LAG) -> np.ndarray:
    """Autocovariance at lags 0..max_lag pooled over sequences (each in step
    order, centred on the pooled mean; a lag pairs steps of one sequence)."""
    mean = float(np.mean(np.concatenate(log_ratios)))
    num = np.zeros(max_lag + 1)
    den = 0
    for x in log_ratios:
        x = x - mean
        den += x.size
        for j in range(min(max_lag + 1, x.size)):
            num[j] += float(np.dot(x[: x.size - j], x[j:]))
    return num / max(den, 1)


def fit_common_var(log_ratios_by_trace: list[np.ndarray]) -> np.ndarray:
    """``common_var`` at ``GRID`` from per-trace log ratios (step order);
    zeros when there are too few steps to measure lags up to ``MAX_LAG``."""
    if sum(x.size for x in log_ratios_by_trace) < MIN_STEPS:
        return np.zeros(GRID.size)
    return common_var_table(autocovariance(log_ratios_by_trace))


def ordered_groups(steps: pd.DataFrame) -> list[pd.DataFrame]:
    """The steps of each (trace, instance) in step order."""
    keys = [k for k in ("trace", "instance_id") if k in steps]
    if not keys:
        return [steps.sort_values("step", kind="stable")]
    return [g for _, g in steps.sort_values([*keys, "step"], kind="stable").groupby(keys, sort=False)]


def common_var_at(table: np.ndarray, n: float) -> float:
    """``common_var(n)`` from a ``GRID`` table (Python twin of the kernel's lookup, for tests and reports)."""
    if n <= 1.0 or not table.any():
        return 0.0
    if n >= GRID[-1]:
        return float(table[-1] * GRID[-1] / n)
    return float(np.interp(n, GRID, table))
