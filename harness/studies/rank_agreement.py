"""Does the twin rank routers as the live runs do? The pure part of the live
study (``harness.studies.route_live``): rankings, Kendall's tau between two
orders, confidence intervals from repeats, and which disagreeing pairs the
repeats cannot separate anyway.

Why intervals: with two or three repeats of a live run, two routers whose
measured OnTimeUtility differs by less than the runs' own spread have no
measured order; a twin that orders them the other way is not wrong. A pair
counts as *separated* when the two routers' intervals (mean +- t * sd /
sqrt(n), Student's t at 95%) do not overlap.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Student's t, two-sided 95% (0.975 quantile), by degrees of freedom (no scipy in latroute's dependencies)
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (the
    table's nearest lower entry: a conservative interval), 1.96 beyond 30."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df > 30:
        return 1.96
    return _T975[max(k for k in _T975 if k <= df)]


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int

    def overlaps(self, other: Interval) -> bool:
        return self.lo <= other.hi and other.lo <= self.hi


def interval(values) -> Interval:
    """Mean and 95% t-interval of repeated measurements (one value: a point)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0 or not np.isfinite(v).all():
        raise ValueError("interval needs finite values")
    m = float(v.mean())
    if v.size == 1:
        return Interval(m, m, m, 1)
    half = t975(v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return Interval(m, m - half, m + half, int(v.size))


def ranking(scores: dict[str, float]) -> list[str]:
    """Names best first (highest score); equal scores keep the given order."""
    return sorted(scores, key=lambda k: -scores[k])


def kendall_tau(a: dict[str, float], b: dict[str, float]) -> float:
    """Kendall's tau-b between two scorings of the same names: concordant
    minus discordant pairs over the pairs each scoring orders (ties in
    either count in neither, tau-b's correction). NaN when one orders none."""
    if set(a) != set(b):
        raise ValueError(f"the two scorings name different routers: {sorted(set(a) ^ set(b))}")
    names = list(a)
    conc = disc = ties_a = ties_b = 0
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            da = np.sign(a[names[i]] - a[names[j]])
            db = np.sign(b[names[i]] - b[names[j]])
            if da == 0 and db == 0:
                continue
            if da == 0:
                ties_a += 1
            elif db == 0:
                ties_b += 1
            elif da == db:
                conc += 1
            else:
                disc += 1
    denom = math.sqrt((conc + disc + ties_a) * (conc + disc + ties_b))
    return (conc - disc) / denom if denom else float("nan")


@dataclass(frozen=True)
class PairDisagreement:
    better_measured: str
    worse_measured: str
    measured_diff: float
    predicted_diff: float  # predicted(better_measured) - predicted(worse_measured): <= 0 when the twin disagrees
    separated: bool  # the measured intervals do not overlap: the runs do order this pair


def disagreements(measured: dict[str, Interval], predicted: dict[str, float]) -> list[PairDisagreement]:
    """Every pair the twin orders differently from the measured means (a
    predicted tie counts as a disagreement), with whether the repeats
    separate it."""
    names = ranking({k: v.mean for k, v in measured.items()})
    out = []
    for i, hi in enumerate(names):
        for lo in names[i + 1:]:
            dm = measured[hi].mean - measured[lo].mean
            dp = predicted[hi] - predicted[lo]
            if dm > 0 and dp <= 0:
                out.append(PairDisagreement(hi, lo, dm, dp, not measured[hi].overlaps(measured[lo])))
    return out


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / |measured|; inf when measured is 0 and predicted is not."""
    if measured == 0:
        return 0.0 if predicted == 0 else math.inf
    return (predicted - measured) / abs(measured)


def verdict(measured: dict[str, Interval], predicted: dict[str, float], tolerance: float = 0.15) -> dict:
    """The acceptance check: every router's prediction within ``tolerance``
    of its measured mean, and every disagreeing pair inside the repeats'
    interval."""
    rel = {k: relative_error(predicted[k], measured[k].mean) for k in measured}
    pairs = disagreements(measured, predicted)
    return {"relative_error": rel, "within_tolerance": {k: abs(e) <= tolerance for k, e in rel.items()},
            "all_within_tolerance": all(abs(e) <= tolerance for e in rel.values()),
            "measured_ranking": ranking({k: v.mean for k, v in measured.items()}),
            "predicted_ranking": ranking(predicted), "kendall_tau": kendall_tau(
                {k: v.mean for k, v in measured.items()}, predicted),
            "disagreements": [p.__dict__ for p in pairs],
            "rankings_agree_within_noise": not any(p.separated for p in pairs), "tolerance": tolerance}
