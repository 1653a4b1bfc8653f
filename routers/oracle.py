"""The clairvoyant reference router (``oracle``; docs/concepts/routing.md).

At each arrival it forks every instance's future in the twin (the state,
the in-flight step's true end, the true output lengths of its residents and
its noise stream), adds the query with its true output length and runs
the fork until the query's first token: the query's true
TTFT there, given the arrivals so far (later arrivals are not routed yet,
so a fork is exact unless a later arrival changes the instance's batches
before the query's first token). It picks the highest utility among the
instances where the query is on time, else the fastest. Greedy per query,
so a strong reference, not a proven bound: a router may beat it.

The fork is the twin's: the instances it hands to routers offer it as
``true_first_token`` (``routers.base.ClairvoyantView``); the router never
imports the twin.
"""
from __future__ import annotations

import math

import numpy as np

from routers.base import RouteInputs, Router

HORIZON_GROWTH = 4.0  # run a fork to the SLO first, then to 4x, 16x, ... the SLO until the first token
MAX_HORIZON_S = 3600.0


class Oracle(Router):
    name = "oracle"
    oracle = True  # the twin hands it the live instances (their forks), not honest views

    def __init__(self, inputs: RouteInputs, true_outputs: np.ndarray, frontend_overhead_s: float = 0.0):
        super().__init__(inputs)
        self.outputs = np.maximum(np.asarray(true_outputs, dtype=np.int64), 1)
        self.overhead = frontend_overhead_s
        self.ttft = np.zeros(0)

    def true_ttft(self, inst, i: int, t: float, horizon: float) -> float:
        """The query's TTFT on a fork of ``inst`` if at most ``horizon``, else inf."""
        p = int(self.inputs.prompt[i])
        if p >= inst.max_model_len:
            return math.inf
        first = inst.true_first_token(i, p, int(self.outputs[i]), t, t + horizon)
        if not math.isnan(first):
            return first - t + self.overhead
        return math.inf

    def choose(self, i, t, insts) -> int:
        u = self.inputs.utility[i]
        slo = float(self.inputs.slo[i])
        n = len(insts)
        if self.ttft.size != n:
            self.ttft = np.zeros(n)
        base = max(slo - self.overhead, 1e-3) if math.isfinite(slo) else 1.0
        for j in range(n):
            self.ttft[j] = self.true_ttft(insts[j], i, t, base)
        best, best_u = -1, -np.inf
        for j in range(n):
            if self.ttft[j] <= slo and u[j] > best_u:
                best, best_u = j, u[j]
        if best >= 0:
            return best
        # nobody on time: the fastest (forks run further, horizon growing)
        h = base
        while not np.isfinite(self.ttft).any() and h < MAX_HORIZON_S:
            h *= HORIZON_GROWTH
            for j in range(n):
                self.ttft[j] = self.true_ttft(insts[j], i, t, h)
        if not np.isfinite(self.ttft).any():
            return min(range(n), key=lambda j: (insts[j].residents, j))
        return int(np.argmin(self.ttft))
