"""Baseline TTFT estimators (docs/concepts/estimators.md), each over the same honest
snapshot as SFS.

- ``throughput``: wait = outstanding prefill tokens of residents / theta_pre
  + p_i / theta_pre + mean decode-step time.
- ``lps`` (paper form, average case, no snapshot): the instance is a server
  sharing capacity among up to k requests; with mu = k / m the total service
  rate and a the calibration trace's mean arrival rate,
  W = (a/mu)^k / (mu - a); TTFT = W + p_i / theta_pre + mean decode step.
- ``lps-mg``: general-service approximation with an online EWMA arrival rate
  a: rho = a m / k, P(wait) ~ rho^k, Wq ~ rho^k (m/k)(1 + c2) / (2(1 - rho)).
  The one-server form is rho = a m; with k slots the per-slot
  utilisation is the one that stays below 1.
- ``queue``: TTFT = b0 + b1 * residents, calibrated.

Overload (rho >= 1) is clamped at rho = 0.999, so the estimate is large but
finite. ``lps-mg`` holds rho at RHO_MAX_MG = 0.95 instead: its rho comes
from a 10-s EWMA of arrivals, whose noise (about 1/sqrt(a tau), 20% at
2 q/s) pushes rho past 1 on instances that are stable on average, and the
steady-state factor 1/(1 - rho) then reaches 1000x: in the demo 0.65% of
estimates (long-run rho 0.71-0.76 on every instance, true TTFT under 2 s)
carried its 5,243% MAPE. At 0.95 the factor is at most 20 (MAPE 286%);
the formula, not the code, diverges there.

Each has a ``speed`` (host speed factor, ``estimators.timemodel.online_speed``): every
time the profile gave it (prefill rate, decode step, service time, the queue
fit) is scaled by it, as SFS scales its step times, so that online correction
is compared on equal terms.

``cache_aware`` (throughput, lps, lps-mg): prompt tokens a request will take
from the instance's prefix cache are not counted as work (the query's own
hit and, for throughput, the hits of residents that have not started),
looked up read-only in the live cache as SFS does, so the comparison with
SFS on prefix-caching instances is fair.
"""
from __future__ import annotations

import numpy as np

from estimators.engine.layout import F_COMPUTED, F_OUTPUTS, F_PROMPT, F_RID
from estimators.engine.view import InstanceView as Snapshot
from estimators.engine.view import Query

RHO_MAX = 0.999
RHO_MAX_MG = 0.95  # lps-mg: beyond it an EWMA rho cannot tell overload from noise (module docstring)


def nonnegative(seconds: float) -> float:
    """A time estimate floored at 0 (NaN passes through as "no estimate").
    A waiting time is never negative, but a profile's fitted terms may make
    a batch's time negative outside the range they were fitted on (a
    negative curvature term, a request-level fit's offsets) gave
    negative TTFTs. Every estimator's value goes through this."""
    return 0.0 if seconds < 0 else seconds


def outstanding_prefill_tokens(snap: Snapshot, cache_aware: bool = False) -> int:
    """Prompt (and recompute) tokens of residents not yet computed or in
    flight; ``cache_aware``: minus the cached prefix of those not started."""
    slots = snap.resident_slots()
    if slots.size == 0:
        return 0
    st = snap.state
    r = st.req[slots]
    remaining = r[:, F_PROMPT] + r[:, F_OUTPUTS] - r[:, F_COMPUTED]
    prefill = (remaining > 1) | (r[:, F_COMPUTED] < r[:, F_PROMPT])
    total = int(remaining[prefill].sum())
    if cache_aware:
        for row in r[prefill & (r[:, F_COMPUTED] == 0)]:
            total -= st.cached_prefix_tokens(int(row[F_RID]), int(row[F_PROMPT] + row[F_OUTPUTS]))
    return total


def query_prompt(snap: Snapshot, q: Query, cache_aware: bool) -> int:
    """The query's prompt tokens to compute (minus its cached prefix when ``cache_aware``)."""
    return q.prompt - (snap.state.cached_prefix_tokens(q.rid, q.prompt) if cache_aware else 0)


class Throughput:
    name = "throughput"
    speed = 1.0

    def __init__(self, theta_pre: float, mean_decode_step_s: float, frontend_overhead_s: float = 0.0,
                 cache_aware: bool = False):
        self.theta, self.decode, self.overhead = theta_pre, mean_decode_step_s, frontend_overhead_s
        self.cache_aware = cache_aware

    def estimate(self, snap: Snapshot, q: Query) -> float:
        work = outstanding_prefill_tokens(snap, self.cache_aware) + query_prompt(snap, q, self.cache_aware)
        return nonnegative((work / self.theta + self.decode) * self.speed + self.overhead)


class LPS:
    """Paper form. ``online``: use the snapshot's EWMA arrival rate (as a
    router must, since its own routing sets each instance's rate) instead of
    the calibration trace's mean rate."""

    name = "lps"
    speed = 1.0

    def __init__(self, k: int, mean_service_s: float, arrival_rate: float, theta_pre: float,
                 mean_decode_step_s: float, frontend_overhead_s: float = 0.0, online: bool = False,
                 cache_aware: bool = False):
        self.k, self.mu, self.online, self.cache_aware = k, k / mean_service_s, online, cache_aware
        self.arrival_rate = arrival_rate
        self.wait = self._wait(arrival_rate)
        self.theta, self.decode, self.overhead = theta_pre, mean_decode_step_s, frontend_overhead_s

    def _wait(self, a: float, speed: float = 1.0) -> float:
        mu = self.mu / speed
        a = min(a, RHO_MAX * mu)
        return (a / mu) ** self.k / (mu - a)

    def estimate(self, snap: Snapshot, q: Query) -> float:
        if self.online or self.speed != 1.0:
            wait = self._wait(snap.arrival_rate if self.online else self.arrival_rate, self.speed)
        else:
            wait = self.wait
        return nonnegative(wait + (query_prompt(snap, q, self.cache_aware) / self.theta + self.decode) * self.speed
                           + self.overhead)


class LPSMG:
    name = "lps-mg"
    speed = 1.0

    def __init__(self, k: int, mean_service_s: float, scv: float, theta_pre: float, mean_decode_step_s: float,
                 frontend_overhead_s: float = 0.0, cache_aware: bool = False):
        self.k, self.m, self.c2, self.cache_aware = k, mean_service_s, scv, cache_aware
        self.theta, self.decode, self.overhead = theta_pre, mean_decode_step_s, frontend_overhead_s

    def estimate(self, snap: Snapshot, q: Query) -> float:
        m = self.m * self.speed
        rho = min(snap.arrival_rate * m / self.k, RHO_MAX_MG)
        wq = rho**self.k * (m / self.k) * (1.0 + self.c2) / (2.0 * (1.0 - rho))
        return nonnegative(wq + (query_prompt(snap, q, self.cache_aware) / self.theta + self.decode) * self.speed
                           + self.overhead)


class QueueLength:
    name = "queue"
    speed = 1.0

    def __init__(self, b0: float, b1: float, frontend_overhead_s: float = 0.0):
        self.b0, self.b1, self.overhead = b0, b1, frontend_overhead_s

    def estimate(self, snap: Snapshot, q: Query) -> float:
        return nonnegative(max(self.b0 + self.b1 * snap.residents, 1e-6) * self.speed + self.overhead)


def fit_queue(residents: np.ndarray, ttft: np.ndarray) -> dict:
    """b0 + b1 * residents by least squares on relative error (MAPE is the metric)."""
    ok = np.isfinite(ttft) & (ttft > 0)
    X = np.column_stack([np.ones(ok.sum()), residents[ok]]) / ttft[ok, None]
    (b0, b1), *_ = np.linalg.lstsq(X, np.ones(ok.sum()), rcond=None)
    return {"b0": float(b0), "b1": float(b1), "n": int(ok.sum())}
