"""Parameters of the baseline estimators, measured on the same traces a
batch-time profile is calibrated on.

- Throughput baseline: ``theta_pre`` = prefill tokens per second of busy
  time in steps that ran prefill (what a profiler measures), and the mean
  duration of decode-only steps.
- LPS: service time of a request = finish minus the start of the first step
  that scheduled it (its residence in the running set); ``k`` = the 95th
  percentile of batch occupancy (sequences per step), the concurrency the
  instance actually sustained.
"""
from __future__ import annotations

import numpy as np
import pandas as pd


def throughput_params(steps: pd.DataFrame) -> dict:
    dur = (steps["end_s"] - steps["start_s"]).to_numpy(dtype=np.float64)
    P = steps["prefill_tokens"].to_numpy()
    D = steps["decode_tokens"].to_numpy()
    out: dict = {}
    pre = P > 0
    if pre.any() and dur[pre].sum() > 0:
        out["theta_pre_tokens_per_s"] = float(P[pre].sum() / dur[pre].sum())
    dec = (P == 0) & (D > 0)
    if dec.any():
        out["mean_decode_step_s"] = float(dur[dec].mean())
    return out


def lps_params(steps: pd.DataFrame, items: pd.DataFrame, requests: pd.DataFrame) -> dict | None:
    """LPS parameters from one trace's tables, or None when it lacks them."""
    if items.empty or "finish_s" not in requests or requests["finish_s"].isna().all():
        return None
    starts = items.merge(steps[["instance_id", "step", "start_s"]], on=["instance_id", "step"])
    first = starts.groupby("request_id")["start_s"].min()
    req = requests.set_index("request_id")["finish_s"].dropna()
    service = (req - first.reindex(req.index)).dropna().to_numpy()
    service = service[service > 0]
    if service.size < 2:
        return None
    m = float(service.mean())
    return {"k": int(max(1, round(float(np.percentile(steps["num_seqs"], 95))))),
            "mean_service_s": m, "scv": float(service.var() / m**2), "n": int(service.size)}


def pooled_lps(parts: list[dict]) -> dict | None:
    """Pool per-trace LPS estimates, weighting by requests."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    n = np.array([p["n"] for p in parts], dtype=float)
    m = np.array([p["mean_service_s"] for p in parts])
    second = np.array([(p["scv"] + 1) * p["mean_service_s"] ** 2 for p in parts])
    mean = float((n * m).sum() / n.sum())
    ex2 = float((n * second).sum() / n.sum())
    return {"k": int(max(p["k"] for p in parts)), "mean_service_s": mean, "scv": ex2 / mean**2 - 1,
            "n": int(n.sum())}
