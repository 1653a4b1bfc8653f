"""Twin fidelity against a recording (``latroute validate``).

The recording's arrivals are replayed on the twin with the recording's
engine configuration and instance assignment, timed by a batch-time
profile; the twin's per-request TTFT is compared with the measured one and
its step count with the recorded one. A twin replay's served trace may
hold requests its router shed (null instance_id, ``harness.twin.replay``):
they never entered an instance, so the twin sheds them again and only the
served ones are compared. Decision agreement (``decisions``)
checks the kernel step by step against the recorded batches.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from estimators.engine.config import InstanceConfig
from estimators.evaluate.accuracy import error_by_cached_share, error_summary
from estimators.timemodel.drift import trace_drift
from estimators.timemodel.profile import BatchTimeProfile
from harness.twin.fidelity.decisions import decision_agreement
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig, TwinResult, fixed_router
from traces.errors import BadInput
from traces.store import Trace


@dataclass
class Validation:
    metrics: dict
    per_request: pd.DataFrame
    twin: TwinResult


def replay_recording(trace: Trace, profile: BatchTimeProfile, noise: bool, seed: int = 0,
                     record_steps: bool = True) -> TwinResult:
    for name in ("requests", "instances"):
        if not trace.has(name):
            raise BadInput(trace.file(name), None, name, "a recording needs this table to be replayed")
    reqs = trace.read("requests")
    shed = reqs["instance_id"].isna().to_numpy() if "instance_id" in reqs else None
    if shed is None or (shed.any() and (trace.meta.get("source") or {}).get("kind") != "replay"):
        raise BadInput(trace.file("requests"), None, "instance_id", "every request needs the instance that served it")
    instances = trace.read("instances")
    ids = list(instances["instance_id"])
    unknown = set(reqs["instance_id"].dropna()) - set(ids)
    if unknown:
        raise BadInput(trace.file("requests"), None, "instance_id", f"not in the instances table: {sorted(unknown)[0]}")
    specs = [InstanceSpec(InstanceConfig.from_table(instances, i), profile) for i in ids]
    assignment = reqs["instance_id"].map({i: k for k, i in enumerate(ids)}).fillna(-1).to_numpy(dtype=np.int64)
    twin = Twin(specs, TwinConfig(seed=seed, noise=noise, record_steps=record_steps, frontend_overhead_s=0.0))
    cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens"] + (["hash_ids"] if "hash_ids" in reqs else [])
    return twin.run(reqs[cols], fixed_router(assignment), hash_block_tokens=trace.meta.get("hash_block_tokens"))


def validate(trace: Trace, profile: BatchTimeProfile, noise: bool, seed: int = 0) -> Validation:
    res = replay_recording(trace, profile, noise, seed)
    rec = trace.read("requests")
    per = pd.DataFrame({
        "request_id": rec["request_id"].to_numpy(),
        "instance_id": rec["instance_id"].to_numpy(),
        "arrival_s": rec["arrival_s"].to_numpy(),
        "prompt_tokens": rec["prompt_tokens"].to_numpy(),
        "output_tokens": rec["output_tokens"].to_numpy(),
        "ttft_true_s": rec["ttft_s"].to_numpy(dtype=np.float64),
        "ttft_twin_s": res.requests["ttft_s"].to_numpy(dtype=np.float64),
        "finish_true_s": rec["finish_s"].to_numpy(dtype=np.float64) if "finish_s" in rec else np.nan,
        "finish_twin_s": res.requests["finish_s"].to_numpy(dtype=np.float64),
        "preemptions_twin": res.requests["preemptions"].to_numpy(),
    })
    if "cached_tokens" in res.requests:  # prefix caching: the hit granted at first scheduling
        per["cached_twin"] = res.requests["cached_tokens"].to_numpy(dtype=np.float64)
        if "cached_tokens" in rec:
            per["cached_true"] = rec["cached_tokens"].to_numpy(dtype=np.float64)
    ok = np.isfinite(per["ttft_true_s"]) & np.isfinite(per["ttft_twin_s"]) & (per["ttft_true_s"] > 0)
    per["ape"] = np.where(ok, np.abs(per["ttft_twin_s"] - per["ttft_true_s"]) / per["ttft_true_s"], np.nan)
    ttft = error_summary(per.loc[ok, "ttft_twin_s"].to_numpy(), per.loc[ok, "ttft_true_s"].to_numpy())
    recorded_steps = trace.meta.get("tables", {}).get("steps") or (len(trace.read("steps")) if trace.has("steps") else 0)
    agreement = {}
    for inst in trace.read("instances")["instance_id"]:
        if trace.has("steps") and trace.has("step_items"):
            agreement[str(inst)] = decision_agreement(trace, str(inst)).to_json()
    total = sum(a["steps"] for a in agreement.values())
    ids = [str(i) for i in trace.read("instances")["instance_id"]]
    drift = trace_drift(trace, {i: profile for i in ids})
    metrics = {
        "trace": str(trace.path),
        "profile": {"name": profile.name, "form": profile.form, "fitted_on": profile.fitted_on.get("traces")},
        "noise": noise,
        "seed": seed,
        "requests": int(len(per)),
        "ttft": {k: ttft.get(k) for k in ("n", "mape", "median_ape", "p90_ape", "p99_ape")},
        "ttft_mean_s": {"recorded": float(per["ttft_true_s"].mean()), "twin": float(per["ttft_twin_s"].mean())},
        "steps": {"recorded": int(recorded_steps), "twin": int(res.steps_run),
                  "ratio": res.steps_run / recorded_steps if recorded_steps else None},
        "decision_agreement": {"steps": total, "agree": sum(a["agree"] for a in agreement.values()),
                               "rate": (sum(a["agree"] for a in agreement.values()) / total) if total else None,
                               "per_instance": agreement},
        "drift": {i: d.to_json() for i, d in drift.items()},
    }
    if "cached_twin" in per:
        prompt = float(per["prompt_tokens"].sum())
        metrics["hit_rate"] = {"twin": float(per["cached_twin"].sum()) / prompt,
                               "recorded": float(per["cached_true"].sum()) / prompt if "cached_true" in per else None}
    if "cached_true" in per:  # the twin's TTFT error by the recorded share of the prompt served from the cache
        share = per["cached_true"].to_numpy() / np.maximum(per["prompt_tokens"].to_numpy(dtype=np.float64), 1.0)
        metrics["ttft"]["by_cached_share"] = error_by_cached_share(
            per.loc[ok, "ttft_twin_s"].to_numpy(), per.loc[ok, "ttft_true_s"].to_numpy(), share[ok.to_numpy()])
    return Validation(metrics, per, res)
