"""Router names and construction."""
from __future__ import annotations

from estimators.estimate import ESTIMATORS, BaselineParams, build
from routers.base import RouteInputs, Router
from routers.latency_aware import LatencyAware
from routers.prefix_affinity import ROUTERS as PREFIX_ROUTERS
from routers.simple import LatencyAgnostic, LeastTokens, PowerOfTwo, RoundRobin, ShortestQueue

SIMPLE = {"round-robin": RoundRobin, "shortest-queue": ShortestQueue, "least-tokens": LeastTokens,
          "power-of-two": PowerOfTwo, "latency-agnostic": LatencyAgnostic, **PREFIX_ROUTERS}
LATENCY_AWARE = [f"{e}-{rule}" for e in ESTIMATORS for rule in ("hard", "soft")]
ROUTERS = list(SIMPLE) + LATENCY_AWARE
BASELINE_ROUTERS = ("round-robin", "shortest-queue", "latency-agnostic")
MAIN_ROUTERS = ("shortest-queue", "latency-agnostic", "sfs-hard", "sfs-soft")


def needs_baselines(name: str) -> bool:
    return name in LATENCY_AWARE and not name.startswith("sfs-")


def make_router(name: str, inputs: RouteInputs, specs, overhead: float, delta_per_us: float = 0.0, seed: int = 0,
                baselines: dict[str, BaselineParams] | None = None) -> Router:
    if name in SIMPLE:
        return PowerOfTwo(inputs, seed) if name == "power-of-two" else SIMPLE[name](inputs)
    if name not in LATENCY_AWARE:
        raise ValueError(f"unknown router {name!r} (choose from {', '.join(ROUTERS)})")
    est_name, rule = name.rsplit("-", 1)
    ests = [build(est_name, s.profile, (baselines or {}).get(s.instance_id), inputs.pred_total, overhead,
                  online_lps=True) for s in specs]
    return LatencyAware(inputs, ests, rule, delta_per_us, name=name)
