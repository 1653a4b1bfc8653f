"""Latency-aware routers: a TTFT estimator per instance and the hard or
soft rule (``sfs-hard``, ``sfs-soft``, ``throughput-hard``, ``lps-hard``,
``lps-mg-hard``, ...), two-level over replicas (``routers.fleet``)."""
from __future__ import annotations

import numpy as np

from estimators.sfs.bound import ttft_lower_bound
from estimators.snapshot import Query
from routers.base import RouteInputs, Router
from routers.fleet import DEFAULT_TIES, ModelGroups, TieBreaker, break_tie, hard_choice, lazy_reads
from routers.rules import soft_rule


class LatencyAware(Router):
    """``models``: each instance's model (replicas share one; None: every
    instance its own). ``ties``: the level-2 policy (``routers.fleet``).
    ``prune``: skip estimates a lower bound proves useless (exact: the
    decisions are those without it; off for the test that says so)."""

    reads = "views"  # (set per tie policy in __init__)

    def __init__(self, inputs: RouteInputs, estimators: list, rule: str, delta_per_us: float = 0.0,
                 name: str = "latency-aware", online_speed: bool = False, models: list[str] | None = None,
                 ties: str = DEFAULT_TIES, seed: int = 0, prune: bool = True):
        super().__init__(inputs)
        if rule not in ("hard", "soft"):
            raise ValueError(f"unknown rule {rule!r}")
        self.estimators = estimators
        self.rule = rule
        self.delta = delta_per_us
        self.name = name
        self.latency = np.zeros(len(estimators))
        self.online_speed = online_speed  # scale each estimator by its instance's learned host speed
        self.groups = ModelGroups(inputs.utility, models or [str(j) for j in range(len(estimators))])
        self.tie = TieBreaker(ties, seed)
        self.reads = lazy_reads(self.tie, rule == "hard")
        self.prune = prune
        self.seen = np.full(len(estimators), np.inf)  # the pruning gate's memory (routers.fleet.hard_choice)

    def estimate_one(self, j: int, i: int, t: float, insts) -> float:
        est = self.estimators[j]
        if self.online_speed:
            est.speed = insts[j].speed_factor
        return est.estimate(insts[j], Query(i, t, int(self.inputs.prompt[i])))

    def bound_one(self, j: int, i: int, t: float, insts) -> float:
        """A lower bound on ``estimate_one`` (``estimators.sfs.bound``; -inf: none)."""
        est = self.estimators[j]
        if self.online_speed:
            est.speed = insts[j].speed_factor
        return ttft_lower_bound(est, insts[j], t, int(self.inputs.prompt[i]))

    def estimate_all(self, i: int, t: float, insts) -> np.ndarray:
        for j in range(len(insts)):
            self.latency[j] = self.estimate_one(j, i, t, insts)
        return self.latency

    def choose(self, i, t, insts) -> int:
        u = self.inputs.utility[i]
        if self.rule == "soft":
            return self._soft(i, t, insts, u)
        # hard rule, evaluated lazily: walk models by utility and their
        # replicas by the tie policy (lowest-index: instances by (-utility,
        # index), today's one-level walk); the first whose estimate meets the
        # SLO is the hard rule's choice, so the others need no estimate. Only
        # when none qualifies are all estimated (then the fastest wins) -- the
        # same decision as hard_rule on all estimates.
        return hard_choice(self, i, t, insts, float(self.inputs.slo[i]), u)

    def _soft(self, i, t, insts, u) -> int:
        if self.delta == 0.0:  # latency-agnostic: the model by utility; its replica by the tie policy
            j = soft_rule(u, self.latency, 0.0)
            if self.tie.ties == "least-latency" and not self.groups.singletons:
                for k in self.groups.member_lists[self.groups.group_of[j]]:
                    self.latency[k] = self.estimate_one(k, i, t, insts)
            return break_tie(self, j, lambda k: u[k])
        lat = self.estimate_all(i, t, insts)
        j = soft_rule(u, lat, self.delta)
        return break_tie(self, j, lambda k: u[k] - self.delta * (lat[k] if np.isfinite(lat[k]) else 1e30) * 1e6)
