"""How many of a fleet's replicas a run's own completions imply.

Why: a log says which fleet was deployed, not which of it served. In the
H100 LMBench runs at 20-40 q/s the two-replica vLLM deployment completed
requests at half the rate of its 12 q/s run: one replica was serving.
Replayed on two replicas they are off by ~70%; on one, within 14-18%. A
validation that scores a run against the full fleet without asking would
blame the profile for a missing replica.

The evidence is what the run did with its requests, never the TTFT being
scored: its **completion rate** (finished requests over the time from the
first arrival to the last finish) and its **drain time** (last finish after
the last arrival). Both are compared with the twin's replay of the same
arrivals on 1..N replicas under the fleet's assignment (the median over its
seeds); the implied count is the one whose figures are nearest in log terms
(the sum of the two absolute log ratios). A run that does not load its
fleet drains alike on several counts: counts within ``TIE`` of the best
are indistinguishable, and the largest of them is taken (the full fleet
unless the run shows otherwise; ``resolved`` says whether the log singled
one count out). A run whose implied count is below the fleet's is flagged
as partly served. A log that names each request's instance shows its
active replicas directly, and a log without finish times cannot tell.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from estimators.engine.config import InstanceConfig
from estimators.timemodel.profile import BatchTimeProfile
from harness.requestlevel.fleet import FleetSpec
from harness.requestlevel.frontend import FrontEnd
from harness.requestlevel.replay import replay_requests
from harness.requestlevel.request_trace import RequestTrace

TIE = 0.05  # log-error margin within which two replica counts explain a run's completions alike


@dataclass
class ActiveReplicas:
    fleet: int  # replicas deployed
    implied: int  # replicas the run's completions imply
    resolved: bool  # whether no other count explains them as well (within TIE)
    how: str  # what the count rests on
    measured: dict = field(default_factory=dict)  # drain_s, completion_rate
    counts: dict = field(default_factory=dict)  # replicas -> the twin's drain_s, completion_rate, error

    @property
    def partial(self) -> bool:
        return self.implied < self.fleet

    def to_json(self) -> dict:
        return {"fleet": self.fleet, "implied": self.implied, "resolved": self.resolved, "partly_served": self.partial,
                "how": self.how, "measured": self.measured, "by_count": {str(k): v for k, v in self.counts.items()}}

    def line(self) -> str:
        if not self.counts:
            return f"active replicas: {self.implied} of {self.fleet} ({self.how})"
        m = self.measured
        twin = "; ".join(f"{k}: {c['drain_s']:.1f} s, {c['completion_rate']:.2f}/s" for k, c in self.counts.items())
        verdict = (f"PARTLY SERVED: {self.implied} of {self.fleet} replicas" if self.partial else
                   f"{self.implied} of {self.fleet} replicas" + ("" if self.resolved else
                                                                  " (the run does not load its fleet enough to tell "
                                                                  "fewer apart: the full fleet is kept)"))
        return (f"active replicas: {verdict}, from the run's completions (drain {m['drain_s']:.1f} s, "
                f"{m['completion_rate']:.2f} requests/s; the twin on {twin})")


def completion_figures(arrival: np.ndarray, finish: np.ndarray) -> tuple[float, float]:
    """(drain time, completion rate) of the requests with a finish time."""
    ok = np.isfinite(finish)
    if not ok.any():
        return float("nan"), float("nan")
    last = float(finish[ok].max())
    span = last - float(arrival.min())
    return last - float(arrival.max()), float(ok.sum()) / span if span > 0 else float("nan")


def _error(twin: tuple[float, float], measured: tuple[float, float]) -> float:
    return float(sum(abs(np.log(max(t, 1e-9) / max(m, 1e-9))) for t, m in zip(twin, measured)))


def implied_replicas(rt: RequestTrace, spec: FleetSpec, profile: BatchTimeProfile, engine: InstanceConfig,
                     overhead_s: float, virtual_engines: int, frontend: FrontEnd,
                     full: list[np.ndarray]) -> ActiveReplicas:
    """The replicas ``rt``'s completions imply out of ``spec``'s (``full``:
    the twin's finish times on the full fleet, per assignment seed, already
    replayed by the caller; client side, as the log's)."""
    n = spec.replicas
    reqs = rt.requests
    if "finish_s" not in reqs or not np.isfinite(reqs["finish_s"].to_numpy(dtype=np.float64)).any():
        return ActiveReplicas(n, n, False, "the log has no finish times: the full fleet is assumed")
    arrival = reqs["arrival_s"].to_numpy(dtype=np.float64)
    fin_m = reqs["finish_s"].to_numpy(dtype=np.float64)
    timed = np.isfinite(fin_m)
    measured = completion_figures(arrival, fin_m)
    counts = {}
    for k in range(1, n + 1):
        if k == n:
            fins = full
        else:
            fins = [replay_requests(r, profile, engine, overhead_s, virtual_engines=virtual_engines,
                                    frontend=frontend).requests["finish_s"].to_numpy(dtype=np.float64) + overhead_s
                    for r in rt.under(replace(spec, replicas=k))]
        figs = np.array([completion_figures(arrival, np.where(timed, f, np.nan)) for f in fins])
        twin = (float(np.median(figs[:, 0])), float(np.median(figs[:, 1])))
        counts[k] = {"drain_s": twin[0], "completion_rate": twin[1], "error": _error(twin, measured)}
    best = min(c["error"] for c in counts.values())
    alike = [k for k, c in counts.items() if c["error"] <= best + TIE]
    return ActiveReplicas(n, max(alike), len(alike) == 1,
                          "completion rate and drain time, measured vs the twin's on each count",
                          {"drain_s": measured[0], "completion_rate": measured[1]}, counts)
