"""The decision rules of latency-aware routing (docs/concepts/routing.md)."""
from __future__ import annotations

import numpy as np


def hard_rule(utility: np.ndarray, latency: np.ndarray, slo: float) -> int:
    """Among instances whose estimated TTFT meets the SLO pick the highest
    utility; if none qualifies, the lowest estimated TTFT. Ties: lowest index."""
    best, best_u = -1, -np.inf
    fastest, fastest_l = 0, np.inf
    for j in range(len(latency)):  # a few instances: a plain loop beats numpy's call overhead
        lat = latency[j]
        if lat <= slo and utility[j] > best_u:
            best, best_u = j, utility[j]
        if lat < fastest_l:
            fastest, fastest_l = j, lat
    return best if best >= 0 else fastest


def soft_rule(utility: np.ndarray, latency: np.ndarray, delta_per_us: float) -> int:
    """Lagrangian rule: maximise U - delta * L_hat, L_hat in microseconds.
    delta = 0 is the latency-agnostic router (latency is not looked at)."""
    if delta_per_us == 0.0:
        return int(np.argmax(utility))
    score = utility - delta_per_us * np.where(np.isfinite(latency), latency, 1e30) * 1e6
    return int(np.argmax(score))
