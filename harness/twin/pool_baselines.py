"""Baseline-estimator parameters for a pool's instances, measured on a twin
replay (a pool's built-in profiles carry the batch-time model but no
request-level calibration: LPS service times, queue-length fit).

The calibration replay is fixed (4000 requests of the paper's workload at
6 q/s, shortest-queue routing, noise on, seeded), cached per process.
"""
from __future__ import annotations

import tempfile
from dataclasses import replace
from functools import lru_cache

import numpy as np

from estimators.calibrate import load_steps
from estimators.derived import throughput_params
from estimators.estimate import BaselineParams, EstimateConfig, estimate_trace
from harness.twin.pools import load_pool
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig, shortest_queue_router, write_twin_trace
from traces.arrivals import ArrivalSpec
from traces.store import TraceWriter, open_trace
from traces.workload import WorkloadConfig, generate_workload

CALIBRATION_REQUESTS = 4000
CALIBRATION_RATE = 6.0


@lru_cache(maxsize=8)
def pool_baselines(pool_ref: str, seed: int = 0) -> dict[str, BaselineParams]:
    pool = load_pool(pool_ref)
    wl = generate_workload(WorkloadConfig(requests=CALIBRATION_REQUESTS,
                                          arrivals=ArrivalSpec("poisson", CALIBRATION_RATE), seed=seed + 7919))
    res = Twin.from_pool(pool, TwinConfig(seed=seed + 7919)).run(wl.requests, shortest_queue_router)
    out = {}
    with tempfile.TemporaryDirectory(prefix="latroute-baselines-") as tmp:
        path = f"{tmp}/calib"
        with TraceWriter(path) as w:
            write_twin_trace(w, res)
        for inst in res.instances["instance_id"]:
            data = load_steps([path], inst)
            derived = throughput_params(data.steps)
            derived["lps"] = {**(data.lps or {}), "arrival_rate": data.requests.get("arrival_rate", 0.0)}
            derived["queue"] = data.requests.get("queue")
            out[str(inst)] = BaselineParams.from_derived(derived)
        out = throughput_errors(open_trace(path), pool, out)
    return out


def throughput_errors(trace, pool, params: dict[str, BaselineParams]) -> dict[str, BaselineParams]:
    """The throughput estimator's error distribution per instance on the
    calibration trace: mean and standard deviation of log(measured /
    estimated), so ``throughput-cc``/``-eu`` get a distribution as SFS does."""
    specs = {c.instance_id: InstanceSpec.from_config(c) for c in pool.instances}
    models = {k: (specs[k].profile, v) for k, v in params.items()}
    est = estimate_trace(trace, models, EstimateConfig(estimators=("throughput",),
                                                       frontend_overhead_s=pool.frontend_overhead_s)).estimates
    out = {}
    for inst, p in params.items():
        g = est[est["instance_id"] == inst]
        ok = np.isfinite(g["est_s"]) & (g["est_s"] > 0) & (g["true_s"] > 0)
        lr = np.log(g["true_s"][ok].to_numpy() / g["est_s"][ok].to_numpy())
        out[inst] = replace(p, err_log_mu=float(lr.mean()), err_log_sigma=float(lr.std())) if lr.size > 1 else p
    return out
