"""Router decision cost (``latroute bench --only routers``).

Every built-in router replays the same workload (pool qwen3-h100, Poisson,
DESIGN's defaults) and reports the mean wall time of one routing decision,
measured by the replay around each router call, and the replay's speed.
Why one workload for all: a decision's cost depends on the load it sees
(how many instances an SFS hard rule must estimate, how long their queues
are), so the routers are compared on equal terms. Compile time (the
replay's warm-up and the baseline estimators' calibration replay) is
apart, as everywhere in ``bench``.
"""
from __future__ import annotations

import time

from harness.twin.pool_baselines import pool_baselines
from harness.twin.pools import load_pool
from harness.twin.replay import ReplayConfig, replay, warm_up
from routers.registry import ROUTERS, router_entry
from traces.arrivals import ArrivalSpec
from traces.workload import WorkloadConfig, generate_workload

SOFT_DELTA = 1e-6


def run(requests: int = 4000, rate: float = 8.0, seed: int = 0, routers: tuple[str, ...] = tuple(ROUTERS)) -> dict:
    t = time.perf_counter()
    warm_up()
    pool_baselines("qwen3-h100")  # the baseline estimators' calibration replay, once (cached for every router)
    setup_s = time.perf_counter() - t
    wl = generate_workload(WorkloadConfig(requests=requests, arrivals=ArrivalSpec("poisson", rate), seed=seed))
    pool = load_pool("qwen3-h100")
    out: dict = {"pool": "qwen3-h100", "requests": requests, "rate": rate, "setup_s": setup_s,
                 "soft_delta_per_us": SOFT_DELTA, "routers": {}}
    for name in routers:
        # soft rules at the sweep's default delta (at 0 they are latency-agnostic and never estimate)
        cfg = ReplayConfig(router=name, seed=seed, delta_per_us=SOFT_DELTA if router_entry(name).uses_delta else 0.0)
        replay(pool, "qwen3-h100", wl.requests.iloc[:50], wl.quality, cfg)  # this router's own compile, apart
        m = replay(pool, "qwen3-h100", wl.requests, wl.quality, cfg).metrics
        out["routers"][name] = {"mean_decision_us": m["mean_decision_us"], "speedup": m["speedup"],
                                "wall_s": m["wall_s"], "ontime_utility": m["ontime_utility"]}
    return out
