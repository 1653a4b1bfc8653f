"""Twin replay benchmark, run as a child process by ``latroute bench`` so
its peak memory is its own: ``python -m harness.bench.twin N RATE ROUTER``.

Prints one JSON object: warm-up (compile or cache load) apart, then the
replay's wall time, simulated span and the router's mean decision time
(``latroute bench`` runs it under ``harness.bench.peak_mem`` for its peak memory)."""
from __future__ import annotations

import json
import sys
import time


def run(n: int, rate: float, router_name: str, seed: int = 0) -> dict:
    t0 = time.perf_counter()
    from harness.twin.pool_baselines import pool_baselines
    from harness.twin.pools.spec import load_pool
    from harness.twin.replay import ReplayConfig, replay, warm_up
    from routers.registry import needs_baselines
    from traces.workload.arrivals import ArrivalSpec
    from traces.workload.generator import WorkloadConfig, generate_workload

    import_s = time.perf_counter() - t0
    warmup_s = warm_up()
    if needs_baselines(router_name):
        pool_baselines("qwen3-h100")  # calibration replay, not part of the timed run
    wl = generate_workload(WorkloadConfig(requests=n, arrivals=ArrivalSpec("poisson", rate), seed=seed))
    res = replay(load_pool("qwen3-h100"), "qwen3-h100", wl.requests, wl.quality,
                 ReplayConfig(router=router_name, seed=seed))
    m = res.metrics
    return {"pool": "qwen3-h100", "router": router_name, "rate": rate, "requests": n, "import_s": import_s,
            "warmup_s": warmup_s, "wall_s": m["wall_s"], "simulated_s": m["simulated_s"], "speedup": m["speedup"],
            "steps": m["steps"], "steps_per_s": m["steps"] / m["wall_s"], "mean_decision_us": m["mean_decision_us"],
            "ontime_utility": m["ontime_utility"]}


if __name__ == "__main__":
    n, rate, router = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    print(json.dumps(run(n, rate, router)))
