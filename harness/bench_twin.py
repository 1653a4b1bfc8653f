"""Twin replay benchmark, run as a child process by ``latroute bench`` so
its peak memory is its own: ``python -m harness.bench_twin N RATE ROUTER``.

Prints one JSON object: compile (warm-up) time measured apart on a small
replay, then the full replay's wall time and simulated span."""
from __future__ import annotations

import json
import resource
import sys
import time


def run(n: int, rate: float, router_name: str, seed: int = 0) -> dict:
    t0 = time.perf_counter()
    from harness.pools import load_pool
    from harness.twin import Twin, TwinConfig, round_robin_router, shortest_queue_router
    from traces.arrivals import ArrivalSpec
    from traces.workload import WorkloadConfig, generate_workload

    routers = {"shortest-queue": lambda: shortest_queue_router, "round-robin": round_robin_router}
    import_s = time.perf_counter() - t0
    pool = load_pool("qwen3-h100")
    cfg = TwinConfig(seed=seed, record_steps=False)
    small = generate_workload(WorkloadConfig(requests=50, arrivals=ArrivalSpec("poisson", rate), seed=seed)).requests
    t = time.perf_counter()
    Twin.from_pool(pool, cfg).run(small, routers[router_name]())
    warmup_s = time.perf_counter() - t
    wl = generate_workload(WorkloadConfig(requests=n, arrivals=ArrivalSpec("poisson", rate), seed=seed)).requests
    t = time.perf_counter()
    res = Twin.from_pool(pool, cfg).run(wl, routers[router_name]())
    wall = time.perf_counter() - t
    span = res.sim_end_s - float(wl["arrival_s"].iloc[0])
    return {"pool": "qwen3-h100", "router": router_name, "rate": rate, "requests": n, "import_s": import_s,
            "warmup_s": warmup_s, "wall_s": wall, "simulated_s": span, "speedup": span / wall,
            "steps": res.steps_run, "steps_per_s": res.steps_run / wall,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


if __name__ == "__main__":
    n, rate, router = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    print(json.dumps(run(n, rate, router)))
