"""Correlated step-time noise: how much of a trajectory's noise is shared
by its steps, measured on the calibration steps, for SFS's TTFT
distribution (``estimators.sfs.dist``).

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

With it travels the steps' mean ratio for sums, sum(actual) / sum(typical)
over the calibration steps: a TTFT is a sum of steps, and the noise model's
own mean (lognormal fitted to the 10/50/90th percentiles plus detected
stalls) misses it by up to 4% on the vllm_cpu recordings (d7: 1.044 against
1.079, d8: 1.089 against 1.056), a bias that shows at once in the p50 of
long trajectories, where the spread is small.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class TrajectoryNoise:
    """What sums of steps need beyond the per-step noise model."""

    common_var: np.ndarray = field(default_factory=lambda: np.zeros(GRID.size))  # at GRID; zeros: independent
    mean_ratio: float = 0.0  # sum(actual) / sum(typical) on the calibration steps; 0: the noise model's mean

    def to_json(self) -> dict:
        return {"steps": [int(n) for n in GRID], "common_log_var": [float(v) for v in self.common_var],
                "mean_ratio": self.mean_ratio,
                "rule": "a trajectory of n steps (linear between the listed n, falling as 1/n past the last) has its "
                        "random part multiplied by a lognormal factor of mean 1 and this log variance (what its "
                        "steps' noise shares); each step's mean is mean_ratio x typical (sum of actual over sum of "
                        "typical on the calibration steps; 0: the noise model's mean)"}

    @classmethod
    def from_json(cls, d: dict) -> TrajectoryNoise:
        """From a profile's section ({}: independent steps, the noise model's mean)."""
        if not d:
            return cls()
        if list(d.get("steps") or []) != [int(n) for n in GRID]:
            raise ValueError(f"needs steps {[int(n) for n in GRID]} and common_log_var")
        v, m = d.get("common_log_var"), d.get("mean_ratio", 0.0)
        if not isinstance(v, list) or len(v) != GRID.size or not all(_nonneg(x) for x in v):
            raise ValueError(f"common_log_var must be {GRID.size} finite numbers >= 0")
        if not _nonneg(m):
            raise ValueError("mean_ratio must be a finite number >= 0")
        return cls(np.array(v, dtype=np.float64), float(m))


def _nonneg(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x)) and x >= 0
