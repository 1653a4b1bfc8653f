"""A plug-in router for the tests and the README's example: always the
last instance (the pool's largest model)."""
from __future__ import annotations

from routers.base import Router


class LastInstance(Router):
    """always the last instance of the pool"""

    summary = "always the last instance"

    def choose(self, i: int, t: float, insts) -> int:
        return len(insts) - 1


class TwiceThroughput:
    """A plug-in TTFT estimator: twice the prompt's prefill time at the
    profile's prefill rate (needs baseline parameters)."""

    def __init__(self, profile, params, pred_total, frontend_overhead_s):
        self.theta, self.overhead = params.theta_pre, frontend_overhead_s

    def estimate(self, snap, q) -> float:
        return 2.0 * q.prompt / self.theta * self.speed + self.overhead
