"""Fitting the batch-time model: Huber regression, stall detection, a
typical-time refit and the noise model of what is left.

Why this shape:
- Steps on real hardware stall now and then (several times their usual
  time). A plain least-squares fit lets those few rows drag every
  coefficient, so a Huber fit (IRLS, numpy only) finds the typical relation
  first, stalls are flagged against it, and the typical model is refit by
  least squares on the rest.
- MAPE is the metric, so the default loss is *relative*: residuals are
  divided by the observed time, which is least squares on (X/y, 1). The
  absolute loss is available for comparison.
- A step is a stall when its log time ratio to the typical model lies above
  the ``stall_pct`` percentile of the typical-noise distribution (robust
  centre and MAD scale, Gaussian in log space). The percentile therefore
  sets the false-alarm rate among normal steps (0.1% at 99.9) whatever the
  true stall rate is.
- Expected step time (what sums of steps are charged) follows the paper's expected-time rule
  literally: typical + p * mean excess of the rows above the ``stall_pct``
  percentile of residuals (``StallAllowance``).
- The noise model is lognormal jitter around the typical time, fitted to the
  10th/50th/90th percentiles of the typical rows' ratios (so simulated
  residuals reproduce those quantiles), plus stalls: probability p_stall,
  excess (in multiples of the typical time) from the empirical quantiles.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

HUBER_K = 1.345
LOSSES = ("relative", "absolute")
STALL_EXCESS_QUANTILES = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
Z10 = NormalDist().inv_cdf(0.9)  # 1.2816: half the p10-p90 width of N(0, 1)


def scale_columns(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns scaled to unit max so terms of 1e-13 and 1e-3 condition alike."""
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    return X / scale, scale


def _robust_scale(r: np.ndarray) -> float:
    return float(1.4826 * np.median(np.abs(r - np.median(r))))


def least_squares(A: np.ndarray, b: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    As, scale = scale_columns(A)
    if w is not None:
        sw = np.sqrt(w)
        As, b = As * sw[:, None], b * sw
    coef, *_ = np.linalg.lstsq(As, b, rcond=None)
    return coef / scale


def huber_irls(A: np.ndarray, b: np.ndarray, k: float = HUBER_K, max_iter: int = 100, tol: float = 1e-10) -> np.ndarray:
    """Huber M-estimate of b ~ A @ coef by iteratively reweighted least
    squares, with the residual scale re-estimated (MAD) each iteration."""
    coef = least_squares(A, b)
    for _ in range(max_iter):
        r = b - A @ coef
        s = _robust_scale(r)
        if s <= 0:
            break
        u = np.abs(r) / s
        w = np.where(u <= k, 1.0, k / np.maximum(u, 1e-300))
        new = least_squares(A, b, w)
        done = np.max(np.abs(new - coef)) <= tol * max(1e-300, np.max(np.abs(coef)))
        coef = new
        if done:
            break
    return coef


def _system(X: np.ndarray, y: np.ndarray, loss: str) -> tuple[np.ndarray, np.ndarray]:
    if loss == "relative":
        return X / y[:, None], np.ones_like(y)
    if loss == "absolute":
        return X, y
    raise ValueError(f"unknown loss {loss!r} (choose from {', '.join(LOSSES)})")


@dataclass
class NoiseModel:
    """actual = typical * exp(log_mu + log_sigma * Z), plus with probability
    p_stall an extra ``excess`` x typical drawn from the stall quantiles."""

    log_mu: float = 0.0
    log_sigma: float = 0.0
    p_stall: float = 0.0
    stall_excess_mean: float = 0.0
    stall_excess_quantiles: dict[str, float] = field(default_factory=dict)

    def mean_ratio(self) -> float:
        """Mean of actual/typical under this model: E[jitter] + p_stall * mean excess."""
        return float(np.exp(self.log_mu + 0.5 * self.log_sigma**2) + self.p_stall * self.stall_excess_mean)

    def sample_ratio(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n draws of actual/typical."""
        ratio = np.exp(self.log_mu + self.log_sigma * rng.standard_normal(n))
        stall = rng.random(n) < self.p_stall
        if stall.any() and self.stall_excess_quantiles:
            qs = np.array([float(q) for q in self.stall_excess_quantiles])
            vs = np.array(list(self.stall_excess_quantiles.values()))
            ratio[stall] += np.interp(rng.random(int(stall.sum())), qs, vs)
        elif stall.any():
            ratio[stall] += self.stall_excess_mean
        return ratio

    def to_json(self) -> dict:
        return {"kind": "lognormal+stalls", "log_mu": self.log_mu, "log_sigma": self.log_sigma,
                "p_stall": self.p_stall, "stall_excess_mean": self.stall_excess_mean,
                "stall_excess_quantiles": self.stall_excess_quantiles,
                "stall_excess_unit": "multiples of the typical step time"}

    @classmethod
    def from_json(cls, d: dict) -> NoiseModel:
        return cls(float(d.get("log_mu", 0.0)), float(d.get("log_sigma", 0.0)), float(d.get("p_stall", 0.0)),
                   float(d.get("stall_excess_mean", 0.0)),
                   {str(k): float(v) for k, v in (d.get("stall_excess_quantiles") or {}).items()})


@dataclass
class StallAllowance:
    """The expected-time rule (docs/concepts/batch-time.md), literally: the rows whose
    residual lies above the ``stall_pct`` percentile of all residuals are
    the stalls, and expected step time = typical + p_stall * their mean
    excess. (The noise model's stall rate describes the jitter's tail for
    simulation; this allowance is what point estimates add.)"""

    p_stall: float = 0.0
    excess_mean: float = 0.0  # in multiples of the typical time

    @property
    def multiplier(self) -> float:
        return 1.0 + self.p_stall * self.excess_mean


@dataclass
class BatchFit:
    coef: np.ndarray
    stall: np.ndarray  # bool per training row
    noise: NoiseModel
    huber_coef: np.ndarray
    allowance: StallAllowance = field(default_factory=StallAllowance)


def _log_ratio(X: np.ndarray, y: np.ndarray, coef: np.ndarray) -> np.ndarray:
    pred = X @ coef
    return np.log(y / np.where(pred > 0, pred, np.nan))


def fit_batch_model(X: np.ndarray, y: np.ndarray, loss: str = "relative", stall_pct: float = 99.9,
                    rounds: int = 3) -> BatchFit:
    """Huber fit, stall flags, least-squares refit on typical rows, noise."""
    if len(y) < X.shape[1] + 2:
        raise ValueError(f"need at least {X.shape[1] + 2} steps to fit {X.shape[1]} terms, got {len(y)}")
    if not 50.0 < stall_pct < 100.0:
        raise ValueError("stall percentile must be in (50, 100)")
    if np.any(y <= 0):
        raise ValueError("step durations must be positive")
    z = NormalDist().inv_cdf(stall_pct / 100.0)
    A, b = _system(X, y, loss)
    huber = huber_irls(A, b)
    coef = huber
    stall = np.zeros(len(y), dtype=bool)
    for _ in range(rounds):
        lr = _log_ratio(X, y, coef)
        lr_ok = np.where(np.isnan(lr), np.inf, lr)  # a non-positive prediction cannot be typical
        centre = float(np.median(lr[~stall & np.isfinite(lr)]))
        scale = _robust_scale(lr[~stall & np.isfinite(lr)])
        new_stall = lr_ok > centre + z * scale
        coef = least_squares(A[~new_stall], b[~new_stall])
        if np.array_equal(new_stall, stall):
            break
        stall = new_stall
    lr = _log_ratio(X, y, coef)
    typical = lr[~stall & np.isfinite(lr)]
    q10, q50, q90 = np.percentile(typical, [10, 50, 90])
    excess = np.exp(lr[stall & np.isfinite(lr)]) - 1.0
    noise = NoiseModel(
        log_mu=float(q50),
        log_sigma=float((q90 - q10) / (2 * Z10)),
        p_stall=float(stall.mean()),
        stall_excess_mean=float(excess.mean()) if excess.size else 0.0,
        stall_excess_quantiles=({f"{q:g}": float(v) for q, v in zip(STALL_EXCESS_QUANTILES,
                                                                   np.quantile(excess, STALL_EXCESS_QUANTILES))}
                                if excess.size else {}),
    )
    finite = lr[np.isfinite(lr)]
    top = finite[finite > np.percentile(finite, stall_pct)]
    allowance = StallAllowance(p_stall=top.size / len(y), excess_mean=float(np.mean(np.exp(top) - 1.0)) if top.size else 0.0)
    return BatchFit(coef=coef, stall=stall, noise=noise, huber_coef=huber, allowance=allowance)
