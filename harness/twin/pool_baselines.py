"""Baseline-estimator parameters for a pool's instances, measured on a twin
replay (a pool's built-in profiles carry the batch-time model but no
request-level calibration: LPS service times, queue-length fit).

The calibration replay is fixed (4000 requests of the paper's workload at
6 q/s, shortest-queue routing, noise on, seeded), cached per process and
on disk (``harness.twin.baseline_cache``: keyed by the configurations,
their profiles, the seed and the code, so a cached run's bytes are a
computed run's).

Replicas (instances whose configuration differs only in ``instance_id``)
share one calibration: the replay runs on the pool's *distinct*
configurations, one instance each, and every replica takes its
configuration's parameters. A pool without repeated configurations is
calibrated exactly as before. Why: calibrating ``qwen3-h100-x8`` as 24
instances at 6 q/s gave each replica an eighth of the paper's per-instance
load (0.25 q/s), so its LPS service times and queue fit described an idle
engine, not the loads the fleet runs at; and it wrote ~1.6M steps and read
them back once per instance (over 25 minutes per sweep worker). On the
distinct pool, ``qwen3-h100-x8``'s calibration is the paper pool's.
"""
from __future__ import annotations

import tempfile
from dataclasses import asdict, replace
from functools import lru_cache

import numpy as np

from estimators.baselines.params import throughput_params
from estimators.estimate import BaselineParams, EstimateConfig, estimate_trace
from estimators.timemodel.calibrate import load_steps
from estimators.timemodel.profile import load_profile
from harness.twin.baseline_cache import cached_json
from harness.twin.pools.spec import Pool, load_pool
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig, shortest_queue_router, write_twin_trace
from traces.store import TraceWriter, open_trace
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload

CALIBRATION_REQUESTS = 4000
CALIBRATION_RATE = 6.0


def distinct_configs(pool: Pool) -> tuple[Pool, dict[str, str]]:
    """The pool with one instance per configuration (ignoring
    ``instance_id``; the first replica's kept) and, per instance id, the id
    of the instance that stands for it."""
    first: dict[tuple, str] = {}
    kept, stands = [], {}
    for c in pool.instances:
        key = tuple(sorted((k, repr(v)) for k, v in asdict(c).items() if k != "instance_id"))
        if key not in first:
            first[key] = c.instance_id
            kept.append(c)
        stands[c.instance_id] = first[key]
    return replace(pool, instances=tuple(kept)), stands


@lru_cache(maxsize=8)
def pool_baselines(pool_ref: str, seed: int = 0) -> dict[str, BaselineParams]:
    full = load_pool(pool_ref)
    pool, stands = distinct_configs(full)
    parts = {"instances": [{**asdict(c), "profile": load_profile(c.profile).to_json()} for c in pool.instances],
             "frontend_overhead_s": pool.frontend_overhead_s, "seed": seed,
             "requests": CALIBRATION_REQUESTS, "rate": CALIBRATION_RATE}
    stored = cached_json("pool-baselines", parts, lambda: {k: asdict(v) for k, v in _calibrate(pool, seed).items()})
    out = {k: BaselineParams(**v) for k, v in stored.items()}
    return {iid: out[rep] for iid, rep in stands.items()}


def _calibrate(pool: Pool, seed: int) -> dict[str, BaselineParams]:
    """The calibration replay on ``pool`` (one instance per configuration) and its parameters per instance."""
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
        return throughput_errors(open_trace(path), pool, out)


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
