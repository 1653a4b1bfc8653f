"""Probabilistic SFS: cost and accuracy (``latroute bench --only sfs``).

Cost: at a busy 64-resident qwen3-8b H100 state (``harness.bench.sfs``),
the point estimate, the probabilistic one (mean, p50/p90/p99 and
P(TTFT <= SLO)) and the probabilistic one with its quantiles recalibrated
online (``estimators.evaluate.conformal``, after 50 completions) are timed
alternately in the same run. Accuracy: for states
of 4 to 256 residents, the analytic distribution against a brute-force Monte
Carlo over the twin's own noise draws (``noisy_ratio``) with the trajectory
fixed: the Monte Carlo's share of TTFTs below each predicted quantile, and
the largest |P(on time) analytic - Monte Carlo| over SLOs at the Monte
Carlo's 10th..90th percentiles.
"""
from __future__ import annotations

import time

import numpy as np

from estimators.engine.timing import rng_state
from estimators.evaluate.conformal import QuantileRecalibrator
from estimators.sfs.dist import mc_ttft
from estimators.sfs.estimator import SFS
from estimators.snapshot import Query
from estimators.timemodel.profile import load_profile
from harness.bench.sfs import busy_state
from traces.workload.generator import WorkloadConfig, generate_workload


def _profile(p_stall: float | None):
    profile = load_profile("qwen3-8b-h100")
    if p_stall is not None:  # the bundled profile is jitter-only: also check a stalling host
        profile.noise.p_stall = p_stall
        profile.noise.stall_excess_mean = 1.5
        profile.noise.stall_excess_quantiles = {"0.0": 0.2, "0.5": 1.0, "0.9": 3.0, "1.0": 6.0}
    return profile


def run(queries: int = 1000, draws: int = 4000, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    wl = generate_workload(WorkloadConfig(requests=600 + queries, seed=seed)).requests
    lengths = (wl["prompt_tokens"].to_numpy(), wl["output_tokens"].to_numpy())
    out: dict = {"cost_64": {}, "accuracy": {}}
    snap, pred = busy_state(64, 2, rng, lengths)
    sfs = SFS(_profile(None), pred)
    q_prompts = lengths[0][-queries:]
    sfs.estimate_dist(snap, Query(len(pred) - 1, 0.0, int(q_prompts[0])), 1.0)  # compile / load the cache
    point, dist, recal = np.empty(queries), np.empty(queries), np.empty(queries)
    rec = QuantileRecalibrator()
    for k in range(50):  # a recalibrator that has learned something (the cost does not depend on it)
        rec.observe(0.8 + 0.01 * k, (1.0, 1.3, 1.8))
    for i in range(queries):
        q = Query(len(pred) - 1, 0.0, int(q_prompts[i]))
        t = time.perf_counter_ns()
        sfs.estimate(snap, q)
        point[i] = (time.perf_counter_ns() - t) / 1e3
        t = time.perf_counter_ns()
        sfs.estimate_dist(snap, q, 0.5)
        dist[i] = (time.perf_counter_ns() - t) / 1e3
        t = time.perf_counter_ns()
        d = sfs.estimate_dist(snap, q, 0.5)
        rec.adjust(d.p50, d.p90, d.p99)
        recal[i] = (time.perf_counter_ns() - t) / 1e3
    out["cost_64"] = {"point_median_us": float(np.median(point)), "dist_median_us": float(np.median(dist)),
                      "ratio": float(np.median(dist) / np.median(point)),
                      "recalibrated_median_us": float(np.median(recal)),
                      "recalibrated_ratio": float(np.median(recal) / np.median(point))}
    for label, p_stall in (("bundled profile (sigma 0.05, p_stall 0.001)", None), ("jitter + stalls p=0.02", 0.02)):
        profile = _profile(p_stall)
        cover = {lv: [] for lv in ("p50", "p90", "p99")}
        worst = []
        for n in (4, 16, 64, 256):
            snap, pred = busy_state(n, 2, rng, lengths)
            sfs = SFS(profile, pred)
            for i in range(6):
                typ = np.zeros(100_000)
                q = Query(len(pred) - 1, 0.0, int(lengths[0][i]))
                sfs.estimate(snap, q, typ)
                typ = typ[: sfs.last_steps].copy()
                samples = np.empty(draws)
                known, typ0, elapsed = sfs.last_parts()
                mc_ttft(known, typ, sfs.dist_scale, sfs.model.noise, sfs.model.stall_q, sfs.model.stall_v, sfs._cv, typ0,
                        elapsed, draws, rng_state(seed * 1000 + n * 10 + i), samples)
                d = sfs.last_dist(np.inf)
                for lv, v in (("p50", d.p50), ("p90", d.p90), ("p99", d.p99)):
                    cover[lv].append(float(np.mean(samples <= v)))
                gaps = [abs(sfs.p_on_time(float(s)) - float(np.mean(samples <= s)))
                        for s in np.quantile(samples, np.linspace(0.1, 0.9, 9))]
                worst.append(max(gaps))
        out["accuracy"][label] = {"mc_share_below": {k: float(np.mean(v)) for k, v in cover.items()},
                                  "mc_share_below_min": {k: float(np.min(v)) for k, v in cover.items()},
                                  "mc_share_below_max": {k: float(np.max(v)) for k, v in cover.items()},
                                  "max_abs_p_on_time_error": float(np.max(worst)), "draws": draws, "cases": len(worst)}
    return out


if __name__ == "__main__":  # pragma: no cover
    import json
    print(json.dumps(run(), indent=1))
