"""Latency-aware routers: a TTFT estimator per instance and the hard or
soft rule (``sfs-hard``, ``sfs-soft``, ``throughput-hard``, ``lps-hard``,
``lps-mg-hard``, ...)."""
from __future__ import annotations

import numpy as np

from estimators.snapshot import Query
from routers.base import RouteInputs, Router
from routers.rules import hard_rule, soft_rule


class LatencyAware(Router):
    def __init__(self, inputs: RouteInputs, estimators: list, rule: str, delta_per_us: float = 0.0,
                 name: str = "latency-aware"):
        super().__init__(inputs)
        if rule not in ("hard", "soft"):
            raise ValueError(f"unknown rule {rule!r}")
        self.estimators = estimators
        self.rule = rule
        self.delta = delta_per_us
        self.name = name
        self.latency = np.zeros(len(estimators))

    def estimate_one(self, j: int, i: int, t: float, insts) -> float:
        return self.estimators[j].estimate(insts[j], Query(i, t, int(self.inputs.prompt[i])))

    def estimate_all(self, i: int, t: float, insts) -> np.ndarray:
        for j in range(len(insts)):
            self.latency[j] = self.estimate_one(j, i, t, insts)
        return self.latency

    def choose(self, i, t, insts) -> int:
        u = self.inputs.utility[i]
        if self.rule == "soft":
            if self.delta == 0.0:
                return soft_rule(u, self.latency, 0.0)
            return soft_rule(u, self.estimate_all(i, t, insts), self.delta)
        # hard rule, evaluated lazily: walk instances by utility (ties: lowest
        # index); the first whose estimate meets the SLO is the hard rule's
        # choice, so the others need no estimate. Only when none qualifies are
        # all estimated (then the fastest wins) -- the same decision as
        # hard_rule on all estimates.
        slo = float(self.inputs.slo[i])
        order = sorted(range(len(insts)), key=lambda j: (-u[j], j))
        self.latency[:] = np.inf
        for j in order:
            self.latency[j] = self.estimate_one(j, i, t, insts)
            if self.latency[j] <= slo:
                return j
        return hard_rule(u, self.latency, slo)
