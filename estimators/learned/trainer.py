"""Online training of the TTFT model from first tokens that came back.

The causality rule is SFS's online recalibration's
(``estimators.evaluate.conformal``): a request teaches once its first token is
out *strictly before* the arrival of the query being estimated -- its
measured TTFT is then known to anyone watching the stream, and nothing
later is. A sample is the request's features at its own arrival (what the
router saw when it placed it) and its measured TTFT.

The rule is enforced here, not by the caller: labels may be handed in
early (``label`` with a first-token time in the future of some later
query, as ``latroute estimate`` does right after each estimate); they
enter the training window only when ``advance(now)`` is called with a
``now`` strictly after their first token, in first-token order. A fit
happens at an ``advance`` when ``retrain_every_s`` has passed since the
last one, a new sample has arrived and at least ``min_samples`` are there;
it uses the newest ``window`` samples. Fits therefore happen at query
arrival times, never between, so a replay is deterministic.
"""
from __future__ import annotations

import heapq
import math
import time
from collections import deque

import numpy as np

from estimators.learned.model import LearnedConfig, TTFTModel


class OnlineTrainer:
    """One model's samples and fits (llm-d trains one model per pool of
    replicas: instances of one model share a trainer)."""

    def __init__(self, cfg: LearnedConfig | None = None):
        self.cfg = cfg or LearnedConfig()
        self.features: dict[int, np.ndarray] = {}  # request -> its features at arrival, until labelled
        self._labels: list[tuple[float, int, int, float]] = []  # heap of (first token, seq, request, ttft)
        self._seq = 0
        self.window: deque[tuple[np.ndarray, float]] = deque(maxlen=self.cfg.window)
        self.model: TTFTModel | None = None
        self.last_fit_s = -math.inf
        self.new_samples = 0
        self.fits = 0
        self.fit_wall_s = 0.0
        self.samples_seen = 0

    def record(self, rid: int, x: np.ndarray) -> None:
        """Request ``rid`` was placed here with features ``x``."""
        self.features[rid] = x

    def label(self, rid: int, first_token_s: float, ttft_s: float) -> None:
        """Request ``rid``'s first token came at ``first_token_s`` with
        measured TTFT ``ttft_s``; it teaches from the first ``advance``
        strictly after that time. Ignored unless both are finite and the TTFT positive."""
        if math.isfinite(first_token_s) and math.isfinite(ttft_s) and ttft_s > 0:
            heapq.heappush(self._labels, (first_token_s, self._seq, rid, ttft_s))
            self._seq += 1

    def advance(self, now: float) -> None:
        """Admit every label whose first token came strictly before ``now``; refit when due."""
        labels = self._labels
        while labels and labels[0][0] < now:
            _, _, rid, y = heapq.heappop(labels)
            x = self.features.pop(rid, None)
            if x is not None:
                self.window.append((x, y))
                self.new_samples += 1
                self.samples_seen += 1
        if (self.new_samples and len(self.window) >= self.cfg.min_samples
                and now - self.last_fit_s >= self.cfg.retrain_every_s):
            self.fit(now)

    def fit(self, now: float) -> None:
        X = np.vstack([x for x, _ in self.window])
        y = np.array([v for _, v in self.window], dtype=np.float64)
        t0 = time.perf_counter()
        self.model = TTFTModel(self.cfg, X, y)
        self.fit_wall_s += time.perf_counter() - t0
        self.fits += 1
        self.last_fit_s = now
        self.new_samples = 0

    def stats(self) -> dict:
        return {"fits": self.fits, "samples_seen": self.samples_seen, "window": len(self.window),
                "fit_wall_s": self.fit_wall_s, "mean_fit_ms": 1e3 * self.fit_wall_s / self.fits if self.fits else None}
