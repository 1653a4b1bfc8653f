"""``learned``: llm-d's predicted-latency model as a latroute TTFT estimator.

It reads the same honest view as every estimator (``features``), asks the
online model (``trainer``) for the mean and the p50/p90 of the query's
TTFT, and answers the mean. Until the first fit (``LearnedConfig.
min_samples`` labelled samples) it answers the *cold start*: the
throughput baseline, with the lognormal error fitted on the pool's
calibration replay for its quantiles (what ``throughput-cc`` uses).
``last_source`` names which one answered ("learned" or "cold-start").

The estimator never sees a true output length or the in-flight step's end:
its features are the view's counters, and its labels are measured TTFTs
of requests whose first token is already out (``trainer``).
"""
from __future__ import annotations

import math

import numpy as np

from estimators.engine.view import InstanceView, Query
from estimators.learned.features import query_features
from estimators.learned.model import Z90, lognormal_p99, lognormal_p_on_time
from estimators.learned.trainer import OnlineTrainer

LEARNED, COLD_START = "learned", "cold-start"


class LearnedTTFT:
    name = "learned"

    def __init__(self, cold, trainer: OnlineTrainer, err_log_mu: float = 0.0, err_log_sigma: float = 0.0):
        """``cold``: the cold-start estimator (``Throughput``); ``err_log_*``:
        its calibration error, log(measured / estimated)."""
        self.cold, self.trainer = cold, trainer
        self.mu, self.sigma = err_log_mu, err_log_sigma
        self.speed = 1.0  # host speed factor: scales the cold start (the model learns the host from its labels)
        self.last = (math.inf, math.inf, math.inf)  # (point, p50, p90)
        self.last_source = COLD_START
        self.last_x: np.ndarray | None = None
        self.last_rid = -1

    def estimate(self, view: InstanceView, q: Query) -> float:
        x = query_features(view, q)
        self.last_x, self.last_rid = x, q.rid
        tr = self.trainer
        tr.advance(q.t)
        if tr.model is not None:
            mean, p50, p90 = tr.model.predict(x)
            self.last, self.last_source = (mean, p50, p90), LEARNED
            return mean
        self.cold.speed = self.speed
        v = self.cold.estimate(view, q)
        p50 = v * math.exp(self.mu)
        self.last = (v, p50, p50 * math.exp(Z90 * self.sigma))
        self.last_source = COLD_START
        return v

    def record(self, view: InstanceView, q: Query) -> None:
        """Query ``q`` was placed on this instance: its features at arrival
        (those of the last estimate when it was for ``q``) become a sample
        once its first token is measured (``observe``)."""
        if self.last_rid != q.rid or self.last_x is None:
            self.last_x, self.last_rid = query_features(view, q), q.rid
        self.trainer.record(q.rid, self.last_x)

    def observe(self, rid: int, first_token_s: float, ttft_s: float) -> None:
        self.trainer.label(rid, first_token_s, ttft_s)

    def last_dist(self, slo: float = math.inf) -> tuple[float, float, float, float]:
        """(P(on time), p50, p90, p99) of the last estimate (p99 extrapolated: no p99 model is fitted)."""
        _, p50, p90 = self.last
        return self.p_on_time(slo), p50, p90, lognormal_p99(p50, p90)

    def p_on_time(self, slo: float) -> float:
        """P(TTFT <= slo) under the lognormal through the last p50 and p90."""
        _, p50, p90 = self.last
        return lognormal_p_on_time(p50, p90, slo)
