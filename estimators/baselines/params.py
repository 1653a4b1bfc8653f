"""Parameters of the baseline estimators, measured on the same traces a
batch-time profile is calibrated on.

- Throughput baseline: ``theta_pre`` = prefill tokens per second of busy
  time in steps that ran prefill (what a profiler measures), and the mean
  duration of decode-only steps.
- Queue-length baseline: TTFT = b0 + b1 * residents at arrival, fitted on
  the requests' honest snapshots (relative least squares).
- LPS arrival rate (paper form, static): the instance's mean arrival rate.
- LPS: service time of a request = finish minus the start of the first step
  that scheduled it (its residence in the running set); ``k`` = the 95th
  percentile of batch occupancy (sequences per step), the concurrency the
  instance actually sustained.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from estimators.engine.layout import KernelInputError
from estimators.trace_blocks import trace_refusal


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


def residents_at_arrival(trace, instance_id: str, requests: pd.DataFrame,
                         window_s: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(residents seen by each request's honest snapshot, its measured TTFT),
    for the requests arriving within ``window_s`` (all by default)."""
    from estimators.snapshot import RecordedWalk

    ttft = requests["ttft_s"].to_numpy(dtype=np.float64)
    res, tt = [], []
    walk = None
    try:  # a walk the kernels refuse (steps that contradict the requests) is the trace's refusal
        walk = RecordedWalk(trace, instance_id, requests)
        for idx, snap in walk.queries():
            if window_s is not None and not window_s[0] <= snap.t <= window_s[1]:
                continue
            res.append(snap.residents)
            tt.append(ttft[idx])
    except KernelInputError as e:
        step = int(walk.step_ids[walk.k]) if walk is not None and walk.k < len(walk.step_ids) else None
        raise trace_refusal(trace, e, instance_id, step) from None
    return np.asarray(res, dtype=np.float64), np.asarray(tt)


def request_params(traces: list, instance: str, windows_s: list[tuple[float, float] | None] | None = None) -> dict:
    """Queue-baseline fit and mean arrival rate over (trace, instance) pairs
    that have requests with TTFT, steps and step items; with ``windows_s``
    (one per trace), only from the requests arriving within each window."""
    from estimators.baselines.estimators import fit_queue

    res, tt, rates, weights = [], [], [], []
    for k, trace in enumerate(traces):
        window = windows_s[k] if windows_s is not None else None
        if not all(trace.has(t) for t in ("requests", "steps", "step_items", "instances")):
            continue
        reqs = trace.read("requests")
        if "ttft_s" not in reqs or "instance_id" not in reqs:
            continue
        if instance not in set(trace.read("instances")["instance_id"].astype(str)):
            continue
        mine = reqs[reqs["instance_id"] == instance]
        if window is not None:
            mine = mine[mine["arrival_s"].between(*window)]
        if len(mine) >= 3:
            r, t = residents_at_arrival(trace, instance, reqs, window)
            res.append(r)
            tt.append(t)
            arr = mine["arrival_s"].to_numpy(dtype=np.float64)
            span = arr.max() - arr.min()
            if span > 0:
                rates.append((len(arr) - 1) / span)
                weights.append(len(arr))
    out: dict = {}
    if res:
        out["queue"] = fit_queue(np.concatenate(res), np.concatenate(tt))
    if rates:
        out["arrival_rate"] = float(np.average(rates, weights=weights))
    return out
