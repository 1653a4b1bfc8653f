"""Online recalibration of a TTFT distribution's quantiles from the
measured TTFTs of requests whose first token has already come back.

Why: a profile fitted on one run predicts another run of the same model and
host with a level error (the host runs 5-15% faster or slower that day:
d1b and d1c are one workload twice on one host and differ by 5%) and a
workload-dependent bias of the batch-time model (long prefills, preemption).
Step noise is narrow next to those, so a shift of 5-13% moves the predicted
p50's coverage by 20-40 points. Neither is visible in the
calibration recording. What a router or an engine-side estimator does see is
every request's first token as it streams back: the error of its own past
predictions. This module learns from that, and from nothing else: a request
counts once its first token is out, strictly before the query's arrival
(no leak of the truth: its measured TTFT is then known to anyone watching).

The rule is adaptive conformal inference (Gibbs & Candes 2021) in log
time, with delayed feedback: per level L an offset E_L; a query is given
q_L * exp(E_L) (kept monotone across levels), and when its first token
comes back, whether the measured TTFT fell at or below the quantile *it was
given* moves the offset:

    E_L += step * (L - 1{t <= issued q_L})

Summing the updates gives the guarantee, for any sequence of hosts, loads
and model errors: over T completions, the share covered by their issued
quantile is exactly L - (E_T - E_0) / (step * T), and the offsets stay
bounded, so coverage holds in the long run. (Scoring the completion against
the *current* offset instead, as plain quantile tracking does, loses this
when feedback is delayed: with ten requests in flight it under-covers the
median by 3 points in ``tests/estimators/evaluate/test_recalibration.py``.)

Step: 0.1 (log units). A level error of 10-30% is absorbed within a few
completions at the median (each moves E_50 by 0.05 on average) and within
tens at p90, and the bound above is under 1.5 points after 200 completions
for offsets up to 0.3. A smaller step is quieter but slower: the coverage
study reports 0.05 and 0.2 beside it (``harness.studies.coverage``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

LEVELS = (0.5, 0.9, 0.99)
STEP = 0.1


@dataclass(frozen=True)
class RecalibrationConfig:
    step: float = STEP

    def __post_init__(self):
        if not (np.isfinite(self.step) and self.step > 0):
            raise ValueError(f"recalibration step must be a positive number, not {self.step!r}")


class QuantileRecalibrator:
    """The offsets of one instance's quantiles (p50, p90, p99), fed one
    completion at a time. Plain floats: ``adjust`` is three multiplications
    on the path of every probabilistic estimate (``latroute bench --only
    sfs`` times it with the distribution)."""

    def __init__(self, cfg: RecalibrationConfig | None = None):
        self.cfg = cfg or RecalibrationConfig()
        self.offsets = [0.0] * len(LEVELS)
        self.factors = [1.0] * len(LEVELS)  # exp(offsets), kept in step
        self.fed = 0

    def observe(self, measured_s: float, issued) -> None:
        """A completion: its measured TTFT and the quantiles it was given at
        its arrival (``adjust``'s output). Ignored unless both are finite
        and positive."""
        if not (math.isfinite(measured_s) and measured_s > 0
                and all(math.isfinite(q) and q > 0 for q in issued)):
            return
        step = self.cfg.step
        for k, (level, q) in enumerate(zip(LEVELS, issued)):
            self.offsets[k] += step * (level - (measured_s <= q))
            self.factors[k] = math.exp(self.offsets[k])
        self.fed += 1

    def adjust(self, q50: float, q90: float, q99: float) -> tuple[float, float, float]:
        """The recalibrated quantiles of a new query (monotone in the level)."""
        f0, f1, f2 = self.factors
        a, b, c = q50 * f0, q90 * f1, q99 * f2
        if b < a:
            b = a
        if c < b:
            c = b
        return a, b, c


def recalibrate(arrival_s: np.ndarray, measured_s: np.ndarray, quantiles: np.ndarray,
                cfg: RecalibrationConfig | None = None) -> np.ndarray:
    """Each query's recalibrated quantiles (rows of ``quantiles``: p50, p90,
    p99 predicted at its arrival), learned from the queries whose first
    token (arrival + measured TTFT) came strictly before its arrival. Rows
    with non-finite quantiles pass through unchanged and teach nothing."""
    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    measured_s = np.asarray(measured_s, dtype=np.float64)
    out = np.array(quantiles, dtype=np.float64)
    rec = QuantileRecalibrator(cfg)
    first_token = arrival_s + measured_s
    by_completion = np.argsort(first_token, kind="stable")
    j = 0
    for i in np.argsort(arrival_s, kind="stable"):
        while j < len(by_completion) and first_token[by_completion[j]] < arrival_s[i]:
            done = by_completion[j]  # arrived earlier, so its row already holds what it was given
            rec.observe(float(measured_s[done]), out[done].tolist())
            j += 1
        if np.all(np.isfinite(out[i])):
            out[i] = rec.adjust(*out[i])
    return out
