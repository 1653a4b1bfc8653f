"""``llmd-headroom``: llm-d's SLO-aware routing profile over the learned
estimator (llm-d-router's ``slo-headroom-tier-filter`` then its
``latency-scorer`` and weighted-random picker, fed by the predicted-latency
producer), as a latroute router.

Per query, every instance's p90 TTFT is predicted (llm-d's predictor fits
the p90 by default) and its *headroom* is SLO - p90. llm-d routes within
one pool of replicas of one model; latroute's pools hold several models
priced by predicted utility, so the profile is applied at level 2 of the
two-level walk (``routers.fleet``): level 1 takes the models by utility and
stops at the first with a replica of non-negative headroom; among its
replicas:

- tier filter: the positive tier (headroom >= 0), except that with
  probability ``exploration`` (llm-d: 1%) the negative tier is taken when
  there is one, so the predictor keeps seeing slow endpoints;
- latency scorer, positive tier, strategy ``least`` (the endpoint closest
  to its SLO scores 1, the one with most headroom 0: packing, which leaves
  fast endpoints free for tight SLOs); ``most`` the reverse;
- negative tier: idle endpoints first (no residents), then the least
  deficit scores highest;
- picker: an endpoint drawn with probability proportional to its score
  (all equal scores: uniform), from a generator seeded by the replay seed.

When no model has a replica with headroom, every instance is in the
negative tier (idle first, then the least deficit), as in llm-d.
"""
from __future__ import annotations

import numpy as np

from estimators.learned.estimator import LearnedTTFT
from estimators.snapshot import Query
from routers.base import RouteInputs, Router
from routers.fleet import ModelGroups
from routers.learned import FirstTokenFeed, Learning

EXPLORATION = 0.01  # llm-d's tier filter: 99% positive tier / 1% negative
STRATEGIES = ("least", "most")


class LlmdHeadroom(Learning, Router):
    name = "llmd-headroom"

    def __init__(self, inputs: RouteInputs, estimators: list[LearnedTTFT], models: list[str] | None = None,
                 seed: int = 0, exploration: float = EXPLORATION, strategy: str = "least", overhead_s: float = 0.0):
        super().__init__(inputs)
        if not 0.0 <= exploration <= 1.0:
            raise ValueError(f"exploration share must be in [0, 1], got {exploration}")
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown latency-scorer strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")
        self.estimators, self.exploration, self.strategy = estimators, exploration, strategy
        self.groups = ModelGroups(inputs.utility, models or [str(j) for j in range(len(estimators))])
        self.rng = np.random.default_rng(seed)
        self.headroom = np.zeros(len(estimators))
        self.feed = FirstTokenFeed(overhead_s)
        self.explored = 0

    def choose(self, i, t, insts) -> int:
        return self.learned_choice(self._choose, i, t, insts)

    def _choose(self, i, t, insts) -> int:
        self.predict(i, t, insts)
        return self.route(i, insts)

    def predict(self, i, t, insts) -> None:
        """Every instance's p90 headroom for query ``i`` (``self.headroom``;
        each estimator's ``last`` and ``last_x`` hold its prediction and the
        features it was made from): llm-d's predicted-latency producer, run
        once per request for every plugin that reads it."""
        slo = float(self.inputs.slo[i])
        q = Query(i, t, int(self.inputs.prompt[i]))
        h = self.headroom
        for j, est in enumerate(self.estimators):
            est.estimate(insts[j], q)
            h[j] = slo - est.last[2]

    def route(self, i, insts) -> int:
        """The tier filter, scorer and picker over ``predict``'s headroom."""
        h = self.headroom
        for g in self.groups.order(i):
            members = self.groups.member_lists[g]
            pos = [j for j in members if h[j] >= 0.0]
            if not pos:
                continue
            neg = [j for j in members if h[j] < 0.0]
            if neg and self.rng.random() < self.exploration:
                self.explored += 1
                return self._negative(neg, insts)
            return self._pick(pos, h[pos] if self.strategy == "most" else -h[pos])
        return self._negative(list(range(len(insts))), insts)

    def _negative(self, cands: list[int], insts) -> int:
        idle = [j for j in cands if insts[j].residents == 0]
        if idle:
            cands = idle
        return self._pick(cands, self.headroom[cands])  # the least deficit (highest headroom) scores 1

    def _pick(self, cands: list[int], value: np.ndarray) -> int:
        """Weighted random over scores in [0, 1]: the highest ``value`` 1, the lowest 0."""
        if len(cands) == 1:
            return cands[0]
        if not np.isfinite(value).all():  # an infinite SLO or estimate: the best of them, uniformly
            cands = [c for c, v in zip(cands, value) if v == value.max()]
            value = np.zeros(len(cands))
        lo, hi = float(value.min()), float(value.max())
        score = np.ones(len(cands)) if not hi > lo else (value - lo) / (hi - lo)
        k = int(np.searchsorted(np.cumsum(score), self.rng.random() * score.sum(), side="right"))
        return cands[min(k, len(cands) - 1)]
