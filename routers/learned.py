"""Routers over the learned estimator: ``learned-hard`` (the
hard rule on its mean) and ``learned-cc`` (the chance constraint on its
p50/p90), two-level over replicas exactly as ``sfs-hard`` / ``sfs-cc``
(``routers.fleet``), plus what online learning adds: the first tokens.

Why a feed: the model learns from measured TTFTs, and a gateway measures
them as first tokens stream back through it. The twin hands a router that
asks for it (``watch_first_tokens``) a read-only view of its first-token
times; at each arrival the router passes on those strictly before it --
the causality rule of SFS's recalibration -- for the requests it placed,
with the features the chosen instance showed at their arrival. No true
output length, no in-flight step end: the features come from the honest
view and the labels from the past. Without a feed (a twin that offers
none) the model never leaves its cold start, the throughput baseline.
"""
from __future__ import annotations

import math

import numpy as np

from estimators.learned.estimator import LearnedTTFT
from estimators.snapshot import Query
from routers.base import RouteInputs
from routers.chance import ChanceRouter
from routers.latency_aware import LatencyAware


class FirstTokenFeed:
    """The routed requests still waiting for their first token, and the
    twin's first-token times (NaN until out)."""

    def __init__(self, overhead_s: float = 0.0):
        self.overhead = overhead_s  # measured TTFT = first token - arrival + front-end overhead (the twin's)
        self.first_t: np.ndarray | None = None
        self.pending: dict[int, tuple[float, LearnedTTFT]] = {}

    def deliver(self, now: float) -> None:
        """Hand each pending request whose first token came strictly before ``now`` to its estimator."""
        ft = self.first_t
        if ft is None or not self.pending:
            return
        done = []
        for rid, (arrival, est) in self.pending.items():
            f = ft[rid]
            if f < now:  # NaN (not out yet) is not
                est.observe(rid, float(f), float(f) - arrival + self.overhead)
                done.append(rid)
        for rid in done:
            del self.pending[rid]

    def placed(self, est: LearnedTTFT, view, i: int, t: float, prompt: int) -> None:
        """Request ``i`` went to ``view``'s instance: a sample once its first token is out.
        A prompt the instance cannot hold is refused by its front end and never teaches."""
        if prompt >= getattr(view, "max_model_len", math.inf):
            return
        est.record(view, Query(i, t, prompt))
        self.pending[i] = (t, est)


class Learning:
    """What an online-learning router adds to its rule: take the feed, pass
    on the past before deciding, record the choice after."""

    feed: FirstTokenFeed
    estimators: list
    inputs: RouteInputs

    def watch_first_tokens(self, first_t: np.ndarray) -> None:
        self.feed.first_t = first_t

    def learned_choice(self, rule, i: int, t: float, insts) -> int:
        self.feed.deliver(t)
        j = rule(i, t, insts)
        self.feed.placed(self.estimators[j], insts[j], i, t, int(self.inputs.prompt[i]))
        return j


class LearnedHard(Learning, LatencyAware):
    """The hard rule on the learned mean (``LatencyAware``'s two-level walk)."""

    def __init__(self, inputs: RouteInputs, estimators: list[LearnedTTFT], overhead_s: float = 0.0, **kw):
        super().__init__(inputs, estimators, "hard", name="learned-hard", prune=False, **kw)
        self.feed = FirstTokenFeed(overhead_s)
        self.reads = "views"  # the feed holds every instance's first tokens to the arrival: none may lag

    def choose(self, i, t, insts) -> int:
        return self.learned_choice(super().choose, i, t, insts)


class LearnedCC(Learning, ChanceRouter):
    """The chance constraint on the learned quantiles (``ChanceRouter``):
    P(on time) from the lognormal through p50 and p90, so at epsilon 0.1
    the test is exactly p90 <= SLO."""

    def __init__(self, inputs: RouteInputs, estimators: list[LearnedTTFT], epsilon: float, overhead_s: float = 0.0,
                 **kw):
        super().__init__(inputs, estimators, "cc", epsilon, name="learned-cc", **kw)
        self.feed = FirstTokenFeed(overhead_s)
        self.reads = "views"  # the feed holds every instance's first tokens to the arrival: none may lag

    def choose(self, i, t, insts) -> int:
        return self.learned_choice(super().choose, i, t, insts)


