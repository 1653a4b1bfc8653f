"""The gradient-boosted TTFT model: mean, p50 and p90, one LightGBM booster each.

Why three boosters: llm-d trains either a mean or a p90 model; a router
that puts a chance constraint on the TTFT needs a spread as well as a
level, and the pinball loss of a quantile is only comparable with SFS's if
the quantile is fitted as one. Hyper-parameters are llm-d's LightGBM
settings (200 trees, depth 6, learning rate 0.05, 20 samples per leaf,
80% of the features per tree, L1/L2 0.1); its ``subsample=0.8`` is inert
there (LightGBM bags only with ``subsample_freq`` > 0), so none is done
here either.

LightGBM is an optional extra (``pip install latroute[learned]``),
imported when the first model is fitted, never at import time (``latroute
--help`` must not load it). It runs with ``deterministic=True``, one
thread and the given seed, so that the same samples give the same trees
and the same bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# llm-d's example deployment (deploy/dual-server-deployment.yaml of llm-d-latency-predictor): retrain every
# second once 100 samples are there; its code's own default interval is 1800 s
RETRAIN_EVERY_S = 1.0
WINDOW = 100
MIN_SAMPLES = 10  # llm-d's MIN_SAMPLES_FOR_RETRAIN_FRESH: the first model is fitted once this many are labelled
Z90 = 1.2815515655446004  # standard normal 0.9 quantile
Z99 = 2.3263478740408408


@dataclass(frozen=True)
class LearnedConfig:
    """How the online model is trained. ``retrain_every_s``: simulated (or
    recorded) seconds between fits; ``window``: the newest labelled samples
    a fit uses; ``min_samples``: labelled samples before the first fit
    (until then the cold start answers)."""

    retrain_every_s: float = RETRAIN_EVERY_S
    window: int = WINDOW
    min_samples: int = MIN_SAMPLES
    n_estimators: int = 200
    max_depth: int = 6
    learning_rate: float = 0.05
    min_child_samples: int = 20
    feature_fraction: float = 0.8
    seed: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.retrain_every_s) and self.retrain_every_s >= 0):
            raise ValueError(f"retrain interval must be a finite number of seconds >= 0, not {self.retrain_every_s!r}")
        if self.window < 2 or self.min_samples < 2 or self.min_samples > self.window:
            raise ValueError(f"need 2 <= min_samples ({self.min_samples}) <= window ({self.window})")

    def record(self) -> dict:
        return {"retrain_every_s": self.retrain_every_s, "window": self.window, "min_samples": self.min_samples,
                "n_estimators": self.n_estimators, "seed": self.seed, "library": "lightgbm"}

    def params(self, objective: str, alpha: float | None = None) -> dict:
        p = {"objective": objective, "max_depth": self.max_depth, "learning_rate": self.learning_rate,
             "min_child_samples": self.min_child_samples, "min_child_weight": 0.0,
             "feature_fraction": self.feature_fraction, "lambda_l1": 0.1, "lambda_l2": 0.1,
             "num_threads": 1, "deterministic": True, "force_col_wise": True, "seed": self.seed,
             "verbose": -1}
        if alpha is not None:
            p["alpha"] = alpha
        return p


def available() -> bool:
    """Whether LightGBM is installed. Asked only by a command that names a
    learned router (which imports it anyway), never by ``--help``."""
    try:
        lightgbm()
    except RuntimeError:
        return False
    return True


def lightgbm():
    """The LightGBM module, imported on first use; a clear error without the extra."""
    try:
        import lightgbm as lgb
    except ImportError as e:  # pragma: no cover - the extra is installed in CI
        raise RuntimeError("the learned estimator needs LightGBM: pip install 'latroute[learned]'") from e
    return lgb


COMPILE_AFTER = 100  # one-row predictions of a fit before its boosters are turned into compiled forests


class TTFTModel:
    """The three boosters of one fit; asked often enough, walked as compiled
    forests (``estimators.learned.forest``: the same numbers as
    ``Booster.predict``, ~3 µs instead of ~25-300 µs a call). Turning the
    three costs ~10 ms at 100 samples (their text models written and read
    field by field), about ``COMPILE_AFTER`` calls of the boosters: a fit
    is turned once it has been asked that often (a rent-or-buy rule, never
    more than twice the cheaper choice), so a model refitted every second
    and asked a few times stays a booster, and one kept for minutes is
    walked compiled."""

    def __init__(self, cfg: LearnedConfig, X: np.ndarray, y: np.ndarray):
        lgb = lightgbm()
        self.n = len(y)
        self.boosters = []
        self.forests = None
        self.calls = 0
        for objective, alpha in (("regression", None), ("quantile", 0.5), ("quantile", 0.9)):
            data = lgb.Dataset(X, y, params={"verbose": -1, "min_data_in_bin": 1}, free_raw_data=True)
            # keep_training_booster: no text round trip at the end of train (~2 ms a booster; the same model text)
            self.boosters.append(lgb.train(cfg.params(objective, alpha), data, num_boost_round=cfg.n_estimators,
                                           keep_training_booster=True))

    def predict(self, x: np.ndarray) -> tuple[float, float, float]:
        """(mean, p50, p90) of one feature row, floored at 0 and p90 >= p50."""
        self.calls += 1
        if self.forests is None and self.calls > COMPILE_AFTER:
            from estimators.learned.forest import Forest

            self.forests = [Forest.from_model_string(b.model_to_string()) for b in self.boosters]
            self.boosters = None
        if self.forests is not None:
            row = np.asarray(x, dtype=np.float64).ravel()
            mean, p50, p90 = (max(f.predict(row), 0.0) for f in self.forests)
        else:
            row = x.reshape(1, -1)
            mean, p50, p90 = (max(float(b.predict(row, num_threads=1)[0]), 0.0) for b in self.boosters)
        return mean, p50, max(p90, p50)


def lognormal_p99(p50: float, p90: float) -> float:
    """p99 of the lognormal through (p50, p90): the model fits no p99, so this is an extrapolation."""
    if not (p50 > 0 and p90 > p50):
        return p90
    return p50 * (p90 / p50) ** (Z99 / Z90)


def lognormal_p_on_time(p50: float, p90: float, slo: float) -> float:
    """P(TTFT <= slo) under the lognormal through (p50, p90) (a step at p50 when they coincide)."""
    if not (p50 > 0 and math.isfinite(p50)):
        return 1.0 if p50 <= slo else 0.0
    if slo <= 0:
        return 0.0
    if not p90 > p50:
        return 1.0 if p50 <= slo else 0.0
    sigma = math.log(p90 / p50) / Z90
    z = math.log(slo / p50) / sigma
    return 0.5 * math.erfc(-z / math.sqrt(2.0))
