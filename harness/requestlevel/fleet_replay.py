"""What a fleet's replay needs beyond its replicas' own: the least-requests
assignment, made on the twin, and the replicas' results put back together.

Least requests (a proxy sending each request to the replica with the fewest
requests in flight, ties at random: IPVS's ``lc``, Envoy's
``LEAST_REQUEST`` with ``FULL_SCAN``) depends on when requests finish, so
no assignment exists before a replay. It is made here by replaying the
fleet once on the twin, every replica one instance and a router counting
each one's residents (requests handed to it and not finished) at each
client arrival; each replica then replays its share with its front end,
warm-up and deliveries as one engine does (``harness.requestlevel.replay``).
The first replay leaves out what only the second models: the serial front
end (requests reach the router at the client's arrival and are counted
until their last token leaves the engine), virtual engines (a replica is one
scheduler) and a warm cache's warm-up (a warm trace's hits are handed over
outright). Envoy's default least-request policy compares two replicas drawn
at random (``choice_count`` 2), which this full scan does not model.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from estimators.engine.config import InstanceConfig
from estimators.timemodel.profile import BatchTimeProfile
from harness.requestlevel.cache import given_hits
from harness.requestlevel.fleet import Fleet
from harness.requestlevel.request_trace import RequestTrace
from harness.twin.pools.spec import replica_id
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig, TwinResult
from routers.simple import residents_of
from traces.steplog import StepLog

_TIMES = ("arrival_s", "added_s", "finish_s")  # the warm-up rows' times on the replay's clock


def least_requests_assignment(rt: RequestTrace, engine: InstanceConfig, profile: BatchTimeProfile, overhead_s: float,
                              noise: bool = False, seed: int = 0) -> np.ndarray:
    """Each request's replica (0..replicas-1) under least requests, ties
    broken at random from ``rt.fleet.seed``."""
    fleet = rt.fleet
    reqs = rt.requests[["request_id", "arrival_s", "prompt_tokens", "output_tokens"]]
    specs = [InstanceSpec(replace(engine, instance_id=replica_id(engine.instance_id, k, fleet.replicas)), profile)
             for k in range(fleet.replicas)]
    rng = np.random.default_rng([fleet.seed, fleet.replicas, 1])

    def least(i: int, t: float, insts) -> int:
        res = np.asarray(residents_of(insts))
        ties = np.flatnonzero(res == res.min())
        return int(ties[0] if ties.size == 1 else ties[rng.integers(ties.size)])

    least.reads = "residents"
    hits = given_hits(reqs["prompt_tokens"].to_numpy()) if rt.prefix_cache == "warm" else None
    twin = Twin(specs, TwinConfig(seed=seed, noise=noise, record_steps=False, frontend_overhead_s=overhead_s))
    return np.asarray(twin.run(reqs, least, hits=hits).instance_index, dtype=np.int64)


def merge_replicas(parts: list[tuple[int, np.ndarray, TwinResult]], n: int, fleet: Fleet,
                   virtual_engines: int) -> TwinResult:
    """One result from the replicas' (``(replica, its rows of the trace, its
    result)``): the requests in the trace's order, the step logs and
    warm-ups on one clock (a warm replica's replay clock starts at its own
    warm-up: each is moved to the earliest's), warm-up request ids made
    unique across replicas."""
    shift = max(p.extra["time_shift_s"] for _, _, p in parts)
    reqs, logs, warms, index = [], [], [], np.full(n, -1, dtype=np.int64)
    top = max(int(p.requests["request_id"].max()) for _, _, p in parts) + 1 if all(
        pd.api.types.is_integer_dtype(p.requests["request_id"]) for _, _, p in parts) else None
    for k, rows, p in parts:
        d = shift - p.extra["time_shift_s"]
        reqs.append(p.requests.set_axis(rows))
        local = np.asarray(p.instance_index, dtype=np.int64)[-len(rows):] if p.instance_index is not None else 0
        index[rows] = k * virtual_engines + local
        warm = p.extra["warmup"].copy()
        log = p.log
        if log is not None and d:
            log = StepLog(log.steps.assign(start_s=log.steps["start_s"] + d, end_s=log.steps["end_s"] + d),
                          log.step_items, log.preemptions)
        if len(warm):
            for col in _TIMES:
                if col in warm:
                    warm[col] = warm[col] + d
            old = warm["request_id"].to_numpy()
            if top is not None:
                new = top + np.arange(len(warm), dtype=np.int64)
                top += len(warm)
            else:
                new = np.array([f"r{k}-{r}" for r in old], dtype=object)
            warm["request_id"] = new
            if log is not None:
                ids = dict(zip(old.tolist(), new.tolist()))
                log = StepLog(log.steps, _renamed(log.step_items, ids), _renamed(log.preemptions, ids))
        warms.append(warm)
        if log is not None:
            logs.append(log)
    first = parts[0][2]
    hits = {p.extra["warm_hits"] for _, _, p in parts}
    deliveries = [p.extra["deliveries"] for _, _, p in parts if p.extra["deliveries"]]
    served = {k: int(len(rows)) for k, rows, _ in parts}
    extra = {"rejected": sum(p.extra.get("rejected", 0) for _, _, p in parts),
             "shed": sum(p.extra.get("shed", 0) for _, _, p in parts),
             "warmup": pd.concat(warms, ignore_index=True).sort_values("arrival_s", kind="stable", ignore_index=True),
             "time_shift_s": shift,
             "warm_hits": hits.pop() if len(hits) == 1 else "engine cache on some replicas, outright on others",
             "deliveries": ({"rounds": max(d["rounds"] for d in deliveries),
                             "unsettled_s": max(d["unsettled_s"] for d in deliveries)} if deliveries else None),
             "fleet": {**fleet.to_json(), "requests_per_replica": served}}
    merged = pd.concat(reqs).sort_index().reset_index(drop=True)
    if "hash_ids" in merged:  # a replica whose warm set did not fit had its hits handed over: its prompts name no blocks
        merged["hash_ids"] = [h if isinstance(h, list | np.ndarray) else None for h in merged["hash_ids"]]
    return TwinResult(requests=merged, log=StepLog.concat(logs),
                      instances=pd.concat([p.instances for _, _, p in parts], ignore_index=True),
                      sim_end_s=max(p.sim_end_s + shift - p.extra["time_shift_s"] for _, _, p in parts),
                      steps_run=sum(p.steps_run for _, _, p in parts), extra={**first.extra, **extra},
                      instance_index=index)


def _renamed(frame: pd.DataFrame, ids: dict) -> pd.DataFrame:
    """``frame`` with the request ids in ``ids`` replaced (the rest kept)."""
    if frame is None or not len(frame):
        return frame
    rid = frame["request_id"]
    return frame.assign(request_id=rid.map(ids).fillna(rid).astype(rid.dtype))
