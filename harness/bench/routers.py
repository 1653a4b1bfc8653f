"""Router decision cost (``latroute bench --only routers``).

Every built-in router replays the same workload (pool qwen3-h100, Poisson,
the paper's defaults) and reports the mean wall time of one routing decision,
measured by the replay around each router call, and the replay's speed.
Why one workload for all: a decision's cost depends on the load it sees
(how many instances an SFS hard rule must estimate, how long their queues
are), so the routers are compared on equal terms. Compile time (the
replay's warm-up and the baseline estimators' calibration replay) is
apart, as everywhere in ``bench``.

Fleet sizes (``fleet_sizes``): shortest-queue, sfs-cc and sfs-hard on the
replica pools (3, 24, 96 and 384 instances) at the paper pool's load per
instance (8 q/s per three instances), each tie policy of the two-level
routers, so that the decision's cost against the number of replicas is
measured in one run (targets at 96 instances: shortest-queue <= 3 us,
sfs-cc <= 30 us).
"""
from __future__ import annotations

import time

from harness.twin.pool_baselines import pool_baselines
from harness.twin.pools.spec import load_pool
from harness.twin.replay import ReplayConfig, replay, warm_up
from routers.fleet import DEFAULT_TIES
from routers.registry import ROUTERS, router_entry
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload

SOFT_DELTA = 1e-6
FLEET_POOLS = ("qwen3-h100", "qwen3-h100-x8", "qwen3-h100-x32", "qwen3-h100-x128")
FLEET_ROUTERS = ("shortest-queue", "sfs-cc", "sfs-hard")
RATE_PER_INSTANCE = 8.0 / 3.0  # the paper's pool at 8 q/s
FLEET_SIMULATED_S = 10.0  # arrivals per cell: rate x this (at least FLEET_MIN_REQUESTS)
FLEET_MIN_REQUESTS = 2000
ALL_TIES_UP_TO = 96  # instances: past it only the default (least-latency estimates every replica: minutes at 384)


def default_routers() -> tuple[str, ...]:
    """Every registry router; the learned ones only where LightGBM is installed."""
    from estimators.learned.model import available

    have = available()
    return tuple(n for n in ROUTERS if have or router_entry(n).estimator != "learned")


def run(requests: int = 4000, rate: float = 8.0, seed: int = 0, routers: tuple[str, ...] | None = None) -> dict:
    t = time.perf_counter()
    warm_up()
    pool_baselines("qwen3-h100")  # the baseline estimators' calibration replay, once (cached for every router)
    setup_s = time.perf_counter() - t
    wl = generate_workload(WorkloadConfig(requests=requests, arrivals=ArrivalSpec("poisson", rate), seed=seed))
    pool = load_pool("qwen3-h100")
    routers = default_routers() if routers is None else routers
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


def fleet_sizes(pools: tuple[str, ...] = FLEET_POOLS, routers: tuple[str, ...] = FLEET_ROUTERS,
                ties: tuple[str, ...] = ("lowest-index", "random", "least-latency"), seed: int = 0,
                simulated_s: float = FLEET_SIMULATED_S) -> dict:
    """Mean decision us per pool size, router and tie policy (shortest-queue has none)."""
    warm_up()
    out: dict = {"rate_per_instance": RATE_PER_INSTANCE, "simulated_s": simulated_s, "sizes": {}}
    for ref in pools:
        pool = load_pool(ref)
        n = len(pool.instances)
        rate = RATE_PER_INSTANCE * n
        requests = max(FLEET_MIN_REQUESTS, int(rate * simulated_s))
        wl = generate_workload(WorkloadConfig(requests=requests, arrivals=ArrivalSpec("poisson", rate), seed=seed))
        cells: dict = {}
        for name in routers:
            policies = ties if n <= ALL_TIES_UP_TO else (DEFAULT_TIES,)
            for tie in policies if router_entry(name).estimator is not None else (DEFAULT_TIES,):
                cfg = ReplayConfig(router=name, seed=seed, ties=tie)
                m = replay(pool, ref, wl.requests, wl.quality, cfg).metrics
                key = name if router_entry(name).estimator is None else f"{name} --ties {tie}"
                cells[key] = {"mean_decision_us": m["mean_decision_us"], "speedup": m["speedup"],
                              "ontime_utility": m["ontime_utility"]}
        out["sizes"][n] = {"pool": ref, "rate": rate, "requests": requests, "routers": cells}
    return out
