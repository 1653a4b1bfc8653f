"""Wall time of one learned-model refit and one prediction, by window size
(docs/results/learned-estimates.md: what training costs).

Why a separate measurement: ``estimate`` reports the mean fit over a trace,
and on 200-request recordings most fits hold fewer than the 100-sample
window; whether a refit keeps up at 1,000 requests/s needs the cost of a
full window (and of larger ones, if the window grew with the rate). The
samples are synthetic (seeded; llm-d's 9 features with plausible ranges,
a TTFT that rises with queue and prompt): LightGBM's cost depends on the
sample count, features and trees, not on the values.

``latroute study learned-fit-cost [--windows 100,1000,10000] [--repeats 5]``
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from estimators.learned.features import N_FEATURES
from estimators.learned.model import COMPILE_AFTER, LearnedConfig, TTFTModel


def samples(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.column_stack([
        rng.integers(0, 2, n), rng.uniform(0, 100, n), rng.integers(10, 2000, n), rng.integers(0, 20, n),
        rng.integers(0, 64, n), rng.integers(0, 4000, n), rng.integers(0, 64, n), rng.uniform(0, 1, n),
        rng.integers(10, 2000, n)]).astype(np.float64)[:, :N_FEATURES]
    y = 0.02 + 1e-5 * X[:, 2] + 0.01 * X[:, 3] + rng.lognormal(-4, 0.5, n)
    return X, y


def study(windows: tuple[int, ...], repeats: int) -> None:
    """Print the table: per window size, refit and prediction times."""
    cfg = LearnedConfig()
    X, y = samples(100, seed=1)
    warm = TTFTModel(cfg, X, y)
    for i in range(COMPILE_AFTER + 2):  # loads the compiled walk's JIT cache before anything is timed
        warm.predict(X[i % 100])
    print("| window (samples) | refit ms (3 boosters x 200 trees), median | booster predict us | compile ms | compiled predict us |")
    print("|---|---|---|---|---|")
    for n in windows:
        X, y = samples(n)
        TTFTModel(cfg, X, y)  # warm-up (imports, allocations)
        fits = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            m = TTFTModel(cfg, X, y)
            fits.append(time.perf_counter() - t0)
        row = X[0]
        t0 = time.perf_counter()
        for i in range(COMPILE_AFTER):  # the booster path (LightGBM's own one-row predict, three boosters)
            m.predict(X[i % n])
        boost = (time.perf_counter() - t0) / COMPILE_AFTER
        t0 = time.perf_counter()
        m.predict(row)  # the next call compiles the forests
        compile_ms = 1e3 * (time.perf_counter() - t0)
        m.predict(row)
        t0 = time.perf_counter()
        for i in range(2000):
            m.predict(X[i % n])
        comp = (time.perf_counter() - t0) / 2000
        print(f"| {n} | {1e3 * statistics.median(fits):.1f} | {1e6 * boost:.0f} | {compile_ms:.1f} | {1e6 * comp:.1f} |")
