"""One cell of ``latroute bench --only fleet``, run in a child process:
``python fleet_cell.py POOL ROUTER RATE REQUESTS SEED [TIES|- [REPEATS]]``.

Why a plain script that imports only long-standing APIs (``replay``,
``load_pool``, ``generate_workload``, wherever the checkout keeps them): ``bench --only fleet --against
PATH`` copies this file out of the package and runs it with
``PYTHONPATH=PATH``, so the same cell measures another checkout (e.g. main
before the fleet loop) in the same run, on the same machine load.

Prints one JSON object: the warm-up (compile or cache load, and a first
short replay on the pool itself so the fleet's own first-call costs are
apart) and the timed replay's wall time, simulated span, instances and
mean decision time (and instance-seconds per second of the replay less
the router's decisions: the twin's own speed), and the process's peak
resident memory.
"""
from __future__ import annotations

import json
import sys
import time


def _vm_hwm_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def run(pool_ref: str, router: str, rate: float, requests: int, seed: int, ties: str | None = None,
        repeats: int = 1) -> dict:
    """The timed replay ``repeats`` times on one warm-up: the run of median
    wall time is reported (a cell lasts about a second, and this machine's
    speed wanders by more than the changes measured; the runs are the same
    bytes, so only their time differs)."""
    t0 = time.perf_counter()
    from harness.twin.replay import ReplayConfig, replay, warm_up

    # a checkout from before the house's rooms keeps these in the modules named second
    try:
        from harness.twin.pools.spec import load_pool
    except ModuleNotFoundError:
        from harness.twin.pools import load_pool
    try:
        from traces.workload.arrivals import ArrivalSpec
        from traces.workload.generator import WorkloadConfig, generate_workload
    except ModuleNotFoundError:
        from traces.arrivals import ArrivalSpec

        from traces.workload import WorkloadConfig, generate_workload

    warm_up()
    pool = load_pool(pool_ref)
    extra = {} if ties is None else {"ties": ties}  # (a checkout before the two-level routers has no ties)
    warm = generate_workload(WorkloadConfig(requests=max(50, len(pool.instances)), arrivals=ArrivalSpec("poisson", rate),
                                            seed=seed + 1))
    replay(pool, pool_ref, warm.requests, warm.quality, ReplayConfig(router=router, seed=seed, **extra))
    warmup_s = time.perf_counter() - t0
    wl = generate_workload(WorkloadConfig(requests=requests, arrivals=ArrivalSpec("poisson", rate), seed=seed))
    runs = [replay(pool, pool_ref, wl.requests, wl.quality, ReplayConfig(router=router, seed=seed, **extra)).metrics
            for _ in range(max(1, repeats))]
    m = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
    n_inst = len(pool.instances)
    twin_s = m["wall_s"] - requests * m["mean_decision_us"] / 1e6  # the replay less the router's own decisions
    return {"pool": pool_ref, "instances": n_inst, "router": router, "rate": rate, "requests": requests,
            "warmup_s": warmup_s, "wall_s": m["wall_s"], "simulated_s": m["simulated_s"],
            "instance_s_per_s": n_inst * m["simulated_s"] / m["wall_s"], "speedup": m["speedup"],
            "twin_instance_s_per_s": n_inst * m["simulated_s"] / twin_s if twin_s > 0 else float("nan"),
            "steps": m["steps"], "mean_decision_us": m["mean_decision_us"],
            "ontime_utility": m["ontime_utility"], "peak_rss_mb": _vm_hwm_mb(),
            "walls_s": [r["wall_s"] for r in runs]}


if __name__ == "__main__":
    a = sys.argv[1:]
    ties = a[5] if len(a) > 5 and a[5] != "-" else None
    print(json.dumps(run(a[0], a[1], float(a[2]), int(a[3]), int(a[4]), ties, int(a[6]) if len(a) > 6 else 1)))
