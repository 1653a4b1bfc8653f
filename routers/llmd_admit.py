"""``llmd-admit``: llm-d's ``latency-slo-admitter`` in front of
``llmd-headroom`` (llm-d-router's
``pkg/epp/framework/plugins/requestcontrol/admitter/latencyslo``).

llm-d's admitter runs before scheduling, reads the same per-endpoint
predictions as the headroom filter and never changes which endpoint is
picked: it only *sheds*. A sheddable request with an SLO is rejected only
when all of these hold over every endpoint the gateway routes to:

- no endpoint has a valid prediction (predicted p90 TTFT within the SLO,
  i.e. headroom >= 0, the headroom filter's positive tier);
- no endpoint is idle (zero running requests);
- no endpoint is cold (KV-cache usage below 2%: its predictions are not
  trusted yet);

and if no endpoint has a prediction at all it admits (fail-open).
Non-sheddable requests, and requests without an SLO, always pass.

In latroute, *endpoints* are every instance of the pool, whatever its
model: llm-d's admitter sees the whole pool it routes to. A *prediction*
is the learned model's p90 (``estimators.learned``); an instance whose
model is still at its cold start (the throughput baseline) has none, as
llm-d's producer publishes none before its predictor is trained. Running
requests and KV usage are the features the prediction was made from (what
the gateway's metrics show). latroute's SLO is TTFT only, so every
prediction's TPOT part is valid.

Which requests are sheddable: llm-d sheds only requests of negative
priority; latroute's workloads carry no priority, so a share ``sheddable``
of the requests is (default 1.0: every request, the setting in which the
admitter does anything; the registry entry uses it). Below 1, each
request's flag is drawn once, from its own stream of the replay's seed,
so the headroom picker's draws are the same whatever the share. A shed
request scores utility 0 and counts as an SLO miss
(``harness.twin.replay``).
"""
from __future__ import annotations

import math

import numpy as np

from estimators.learned.estimator import LEARNED, LearnedTTFT
from estimators.learned.features import FEATURES
from routers.base import SHED, RouteInputs
from routers.llmd import LlmdHeadroom

COLD_KV = 0.02  # llm-d: KVCacheUsagePercent < 0.02 is a cold pod
SHEDDABLE_STREAM = 28  # the sheddable flags' own stream of the replay's seed
_KV, _RUNNING = FEATURES.index("kv_cache_percentage"), FEATURES.index("num_request_running")


def admits(sheddable: bool, slo: float, headroom: np.ndarray, predicted: np.ndarray, running: np.ndarray,
           kv: np.ndarray) -> bool:
    """llm-d's ``AdmitRequest`` on one request: per endpoint its p90
    headroom (SLO - p90), whether it has a prediction, its running requests
    and its KV-cache usage (a fraction)."""
    if not sheddable or not slo > 0 or not math.isfinite(slo):  # priority >= 0, or no SLO to judge by
        return True
    if not predicted.any():  # no predictions: fail-open
        return True
    valid = predicted & (headroom >= 0.0)
    return bool(valid.any() or (running == 0).any() or (kv < COLD_KV).any())


def sheddable_flags(n: int, share: float, seed: int) -> np.ndarray:
    """Which of ``n`` requests are sheddable: all (share 1), none (0), or
    each with probability ``share`` from the seed's own stream."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"sheddable share must be in [0, 1], got {share}")
    if share in (0.0, 1.0):
        return np.full(n, share == 1.0)
    return np.random.default_rng((seed, SHEDDABLE_STREAM)).random(n) < share


class LlmdAdmit(LlmdHeadroom):
    name = "llmd-admit"
    sheds = True

    def __init__(self, inputs: RouteInputs, estimators: list[LearnedTTFT], models: list[str] | None = None,
                 seed: int = 0, sheddable: float = 1.0, **kw):
        super().__init__(inputs, estimators, models, seed, **kw)
        self.sheddable = sheddable_flags(len(inputs.slo), sheddable, seed)
        self.shed = 0

    def choose(self, i, t, insts) -> int:
        """The feed first (as every learned router), the predictions once,
        then the admitter; an admitted request is routed on the same
        predictions and becomes a training sample, a shed one does not (it
        never reaches an instance, so no first token comes back)."""
        self.feed.deliver(t)
        self.predict(i, t, insts)
        if not self.admit(i):
            self.shed += 1
            return SHED
        j = self.route(i, insts)
        self.feed.placed(self.estimators[j], insts[j], i, t, int(self.inputs.prompt[i]))
        return j

    def admit(self, i: int) -> bool:
        ests = self.estimators
        predicted = np.array([e.last_source == LEARNED for e in ests])
        running = np.array([e.last_x[_RUNNING] for e in ests])
        kv = np.array([e.last_x[_KV] for e in ests])
        return admits(bool(self.sheddable[i]), float(self.inputs.slo[i]), self.headroom, predicted, running, kv)
