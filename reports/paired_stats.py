"""Confidence intervals over paired seeds.

Every router in a sweep sees the same workloads and noise streams for the
same seed (the workload seed comes from the cell's seed and rate, the
twin's from its seed), so router comparisons are *paired*: the difference
(or ratio) of two routers' AUCs is computed per seed and its spread over
seeds gives the interval, which is much tighter than comparing two
unpaired means. 95% intervals: Student's t over the seeds (K >= 2); with
10 or more seeds also a percentile bootstrap of the mean (fixed seed, so
reruns print the same interval). One seed: no interval (None).
"""
from __future__ import annotations

import numpy as np

# two-sided 95% quantiles of Student's t, by degrees of freedom (1..30)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
BOOTSTRAP_MIN_SEEDS = 10
BOOTSTRAP_DRAWS = 10_000


def t975(dof: int) -> float:
    if dof < 1:
        return float("nan")
    return _T975[dof - 1] if dof <= len(_T975) else 1.96 + 2.4 / dof  # within 0.1% of the exact value past 30


def mean_ci(values) -> dict:
    """Mean over seeds with its 95% t-interval (and bootstrap with >= 10 seeds)."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = len(x)
    out: dict = {"mean": float(x.mean()) if n else float("nan"), "n": int(n), "ci95": None}
    if n >= 2:
        half = t975(n - 1) * float(x.std(ddof=1)) / np.sqrt(n)
        out["ci95"] = [out["mean"] - half, out["mean"] + half]
    if n >= BOOTSTRAP_MIN_SEEDS:
        rng = np.random.default_rng(0)
        means = x[rng.integers(0, n, (BOOTSTRAP_DRAWS, n))].mean(axis=1)
        out["bootstrap_ci95"] = [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]
    return out


def paired(a, b) -> dict:
    """Paired comparison of two per-seed series (same seeds, same order):
    the difference a - b and the ratio a / b, each with its interval."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return {"difference": mean_ci(a - b), "ratio": mean_ci(a / b)}


def paired_on_common(a, b) -> dict:
    """:func:`paired` over the seeds two per-seed series (pandas Series
    indexed by seed) both have, with their count: sweeps of different
    routers, rates or tie policies need not have run the same seeds."""
    common = a.index.intersection(b.index)
    return {"seeds": len(common), **paired(a[common].to_numpy(), b[common].to_numpy())}


def excludes(ci: list[float] | None, value: float) -> bool:
    """The interval lies wholly on one side of ``value``."""
    return ci is not None and (ci[0] > value or ci[1] < value)
