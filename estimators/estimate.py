"""``latroute estimate``: every estimator's TTFT estimate for every request
of a trace with measured TTFT, from honest snapshots, and how far each is
from the truth.

For SFS the error is split in two. The *reference* is the same profile
charged on the steps that really ran from the arrival to the first token
(the in-flight step's expected remainder plus gap + expected time of each
later step): SFS with a perfect trajectory. *Trajectory error* =
|SFS - reference| / reference is what the scheduler simulation and the
length predictions cost, free of step-time noise; *time-model error* =
|reference - true| / true is the rest (the batch-time model and the
recordings' jitter).
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from estimators import plugins
from estimators.baselines.estimators import LPS, LPSMG, QueueLength, Throughput, nonnegative
from estimators.evaluate.accuracy import coinciding_quantiles, coverage, error_by_cached_share, error_summary, pinball  # noqa: F401
from estimators.evaluate.conformal import RecalibrationConfig, recalibrate
from estimators.learned.estimator import LearnedTTFT
from estimators.learned.model import LearnedConfig
from estimators.learned.scoring import carried, pretrained, teach, training_summary
from estimators.learned.trainer import OnlineTrainer
from estimators.plugins import PluginEstimator
from estimators.sfs.estimator import SFS, joining_intake
from estimators.snapshot import Query, RateTracker, RecordedWalk
from estimators.timemodel.calibrate import step_window
from estimators.timemodel.online_speed import OnlineSpeedConfig, running_factors, step_log_ratios
from estimators.timemodel.profile import BatchTimeProfile
from traces.policies.lengths import PredictedLengths, predicted_lengths
from traces.store import Trace

ESTIMATORS = ("sfs", "throughput", "lps", "lps-mg", "queue")
# estimators that need an optional extra (learned: LightGBM), so not in the default list
OPTIONAL_ESTIMATORS = ("learned",)
KNOWN_ESTIMATORS = ESTIMATORS + OPTIONAL_ESTIMATORS
LOAD_BINS = (0, 1, 4, 16, 64, 256)


def load_bin(residents: np.ndarray) -> np.ndarray:
    edges = np.array(LOAD_BINS[1:])
    labels = np.array([f"{lo}-{hi - 1}" if hi - lo > 1 else f"{lo}" for lo, hi in zip(LOAD_BINS, LOAD_BINS[1:])]
                      + [f"{LOAD_BINS[-1]}+"])
    return labels[np.searchsorted(edges, residents, side="right")]


@dataclass
class BaselineParams:
    theta_pre: float
    mean_decode_step_s: float
    lps_k: int
    lps_mean_service_s: float
    lps_scv: float
    lps_arrival_rate: float
    queue_b0: float
    queue_b1: float
    err_log_mu: float = 0.0  # throughput estimator: log(measured / estimated) on the calibration replay
    err_log_sigma: float = 0.0

    @classmethod
    def from_derived(cls, d: dict) -> BaselineParams:
        lps = d.get("lps") or {}
        q = d.get("queue") or {}
        missing = [k for k, v in (("theta_pre_tokens_per_s", d.get("theta_pre_tokens_per_s")),
                                  ("mean_decode_step_s", d.get("mean_decode_step_s")), ("lps", lps or None),
                                  ("queue", q or None)) if v is None]
        if missing:
            raise ValueError(f"profile lacks baseline parameters: {', '.join(missing)} "
                             f"(calibrate it on a trace with requests, steps and step items)")
        return cls(d["theta_pre_tokens_per_s"], d["mean_decode_step_s"], int(lps["k"]), lps["mean_service_s"],
                   lps["scv"], lps.get("arrival_rate", 0.0), q["b0"], q["b1"])


@dataclass
class EstimateConfig:
    estimators: tuple[str, ...] = ESTIMATORS
    lengths: str | None = None  # predicted-length policy (traces.policies.lengths; None: column if present, else median)
    ewma_tau_s: float = 10.0
    frontend_overhead_s: float = 0.0
    online_speed: OnlineSpeedConfig | None = None  # None: the profile as fitted
    cache_blind: bool = False  # estimate as if the instances had no prefix cache (what ignoring it costs)
    cache_aware: bool = False  # baselines count only prompt tokens the prefix cache does not hold
    # score only the requests arriving within this share (A, B) of each instance's steps, in step order (the
    # state still follows every step): with ``calibrate --steps-window``, a profile fitted on the first 30% of a
    # recording is scored on the rest
    score_window: tuple[float, float] | None = None
    # quantiles recalibrated online from the measured TTFTs of requests whose first token came before each
    # arrival (estimators.evaluate.conformal); None: the distribution as the model gives it
    recalibration: RecalibrationConfig | None = None
    # the learned estimator's online training (retrain interval, window); one model per instance
    learned: LearnedConfig = field(default_factory=LearnedConfig)
    learned_train_on: Trace | None = None  # a recording the learned model is first trained on, then carried in
    # ``lps``'s arrival rate: True = each instance's own EWMA of the arrivals routed to it before the query
    # (as ``lps-mg``), False = the calibration traces' pooled mean rate (the paper's form); None = online on a
    # reconstructed trace (``snapshots: reconstructed``), whose calibration pooled every replica's arrivals
    # (often at full utilisation, where the paper's form answers one constant for every request)
    online_lps: bool | None = None
    # plug-in estimators run each in a child process with this per-call limit in seconds
    # (``estimators.plugin_process``: ``--isolate-plugins``); None: in latroute's process
    plugin_timeout_s: float | None = None


@dataclass
class EstimateResult:
    estimates: pd.DataFrame
    attribution: pd.DataFrame  # SFS only: per request reference and errors
    metrics: dict = field(default_factory=dict)


def build(name: str, profile: BatchTimeProfile, params: BaselineParams | None, pred_total: np.ndarray,
          overhead: float, online_lps: bool = False, cache_aware: bool = False,
          trainer: OnlineTrainer | None = None, isolate_s: float | None = None):
    """``trainer``: the learned estimator's online model (instances sharing
    one share what they learn; None: a model of its own). ``isolate_s``: a
    plug-in runs in a child process with this per-call limit (seconds)."""
    if name == "sfs":
        return SFS(profile, pred_total, overhead)
    if ":" in name:
        if isolate_s is not None:
            from estimators.plugin_process import IsolatedEstimator

            return IsolatedEstimator(name, (profile, params, pred_total, overhead), isolate_s)
        return plugin_estimator(name, profile, params, pred_total, overhead)
    if params is None:
        raise ValueError(f"estimator {name} needs baseline parameters")
    if name == "throughput":
        return Throughput(params.theta_pre, params.mean_decode_step_s, overhead, cache_aware)
    if name == "lps":
        return LPS(params.lps_k, params.lps_mean_service_s, params.lps_arrival_rate, params.theta_pre,
                   params.mean_decode_step_s, overhead, online=online_lps, cache_aware=cache_aware)
    if name == "lps-mg":
        return LPSMG(params.lps_k, params.lps_mean_service_s, params.lps_scv, params.theta_pre,
                     params.mean_decode_step_s, overhead, cache_aware)
    if name == "queue":
        return QueueLength(params.queue_b0, params.queue_b1, overhead)
    if name == "learned":  # cold start: the throughput baseline and its calibration error
        return LearnedTTFT(Throughput(params.theta_pre, params.mean_decode_step_s, overhead, cache_aware),
                           trainer or OnlineTrainer(), params.err_log_mu, params.err_log_sigma)
    raise ValueError(f"unknown estimator {name!r} (choose from {', '.join(KNOWN_ESTIMATORS)})")


def plugin_estimator(path: str, profile: BatchTimeProfile, params: BaselineParams | None, pred_total: np.ndarray,
                     overhead: float) -> PluginEstimator:
    """A TTFT estimator named by import path ``module:Class``, built as
    ``Class(profile, params, pred_total, frontend_overhead_s)``. It must
    offer ``estimate(snapshot, query) -> seconds`` over the same honest
    snapshot as the built-ins (``estimators.engine.view``) and a settable
    ``speed`` (host speed factor, 1.0 unless online correction is on). It is
    foreign code (``estimators.plugins``): its failures and wrong answers are
    refused as ``error: plug-in 'module:Class' ...``."""
    return plugins.build_estimator(path, profile, params, pred_total, overhead)


def check_plugin_estimator(path: str) -> None:
    """Load an estimator plug-in and check it is a class, without building
    it (a CLI calls this before any work or output; building needs the
    profile)."""
    obj = plugins.load(path, "estimator", importlib.import_module)
    if not isinstance(obj, type):
        raise plugins.PluginError(path, f"is a {type(obj).__name__}, not an estimator class")


def timed_estimate(est, snap, q: Query, speed: float, warm: set, warmup_us: dict) -> tuple[float, float, tuple]:
    """One estimate, its wall time (us) and its (p50, p90, p99) if the
    estimator gives a distribution; an estimator's first call compiles or
    loads the JIT cache, so it is timed apart (``warmup_us``)."""
    est.speed = speed
    if est.name not in warm:
        t0 = time.perf_counter_ns()
        est.estimate(snap, q)
        warmup_us[est.name] = warmup_us.get(est.name, 0.0) + (time.perf_counter_ns() - t0) / 1e3
        warm.add(est.name)
    t0 = time.perf_counter_ns()
    value = nonnegative(est.estimate(snap, q))  # SFS and plug-ins included
    dt = (time.perf_counter_ns() - t0) / 1e3
    qs = (tuple(nonnegative(v) for v in est.last_dist(np.inf)[1:4]) if hasattr(est, "last_dist")
          else (np.nan, np.nan, np.nan))
    return value, dt, qs


def first_token_steps(walk: RecordedWalk, n_requests: int) -> np.ndarray:
    """Per request (trace index): position of the step that computed its
    last prompt token for the first time, or -1."""
    k = np.repeat(np.arange(len(walk.item_off) - 1), np.diff(walk.item_off))
    done = (walk.item_cb < walk.prompt[walk.item_req]) & (walk.item_cb + walk.item_tok >= walk.prompt[walk.item_req])
    out = np.full(n_requests, -1, dtype=np.int64)
    req, kk = walk.item_req[done], k[done]
    order = np.argsort(kk, kind="stable")[::-1]  # earliest step written last
    out[req[order]] = kk[order]
    return out


def jitter_floor(profile: BatchTimeProfile, steps: pd.DataFrame, parts: list[tuple[int, int, float | None]],
                 overhead: float, draws: int = 20, seed: int = 0) -> np.ndarray:
    """Per query, the mean APE of a perfect estimate (the expected charge of
    the true trajectory) against TTFTs whose steps take the profile's noisy
    times: the error no estimator with this batch-time model can avoid."""
    rng = np.random.default_rng(seed)
    typ = profile.typical(steps)
    exp = typ * profile.expected_multiplier
    gap = profile.step_gap_s
    out = np.zeros(len(parts))
    for _ in range(draws):
        real = typ * profile.noise.sample_ratio(rng, len(typ))
        cum_real = np.concatenate(([0.0], np.cumsum(gap + real)))
        cum_exp = np.concatenate(([0.0], np.cumsum(gap + exp)))
        for i, (k0, f, elapsed) in enumerate(parts):
            if elapsed is not None:
                r = max(real[k0] - elapsed, 0.0) + cum_real[f + 1] - cum_real[k0 + 1]
                e = max(exp[k0] - elapsed, 0.0) + cum_exp[f + 1] - cum_exp[k0 + 1]
            else:
                r = cum_real[f + 1] - cum_real[k0]
                e = cum_exp[f + 1] - cum_exp[k0]
            r, e = r + overhead, e + overhead
            out[i] += abs(e - r) / r if r > 0 else 0.0
    return out / draws


def trace_lengths(trace: Trace, reqs: pd.DataFrame, policy: str | None) -> PredictedLengths:
    """The predicted lengths of ``reqs`` (the trace's requests) under
    ``policy``, the median taken over the trace's own requests: a
    reconstruction's warm-up copies (``meta.warm_prefix.warmup_requests``
    rows first, one output token each) are left out of it."""
    n_warm = int((trace.meta.get("warm_prefix") or {}).get("warmup_requests", 0) or 0)
    return predicted_lengths(reqs, policy, history=reqs.iloc[n_warm:] if n_warm else None)


def lps_online(trace: Trace, cfg: EstimateConfig) -> bool:
    """Whether ``lps`` takes the online arrival rate (``EstimateConfig.online_lps``; by default on a
    reconstructed, request-level trace)."""
    if cfg.online_lps is not None:
        return cfg.online_lps
    return trace.meta.get("snapshots") == "reconstructed"


def estimate_trace(trace: Trace, models: dict[str, tuple[BatchTimeProfile, BaselineParams | None]],
                   cfg: EstimateConfig, progress=None) -> EstimateResult:
    """``models`` maps each instance id to its batch-time profile and
    baseline parameters."""
    reqs = trace.read("requests")
    if "ttft_s" not in reqs:
        raise ValueError(f"{trace.path}: requests have no measured ttft_s to compare with")
    if not (trace.has("steps") and trace.has("step_items") and trace.has("instances")):
        raise ValueError(f"{trace.path}: needs steps, step_items and instances tables to build snapshots")
    lengths = trace_lengths(trace, reqs, cfg.lengths)
    online_lps = lps_online(trace, cfg)
    pred_total = np.array(lengths.tokens, dtype=np.int64)  # own copy: a column's array may view the true lengths
    ttft = reqs["ttft_s"].to_numpy(dtype=np.float64)
    rows, attr, floor_parts, floors = [], [], [], []
    sources: list[str] = []  # per row: which model answered (the learned estimator's cold start says so)
    trainers: list[OnlineTrainer] = []
    carry = pretrained(cfg.learned_train_on, cfg.learned) if cfg.learned_train_on is not None else {}
    warmup_us: dict[str, float] = {}
    rid = reqs["request_id"].to_numpy()
    share = (reqs["cached_tokens"].to_numpy(dtype=np.float64) / np.maximum(reqs["prompt_tokens"].to_numpy(), 1)
             if "cached_tokens" in reqs else np.full(len(reqs), np.nan))  # the recorded hit, for the error by share
    for inst in trace.read("instances")["instance_id"].astype(str):
        if inst not in models:
            raise ValueError(f"no profile for instance {inst!r}")
        profile, params = models[inst]
        walk = RecordedWalk(trace, inst, reqs, caching=False if cfg.cache_blind else None, predicted=pred_total)
        ests = [build(n, profile, params, pred_total, cfg.frontend_overhead_s, online_lps, cfg.cache_aware,
                      trainer=(carried(carry, inst) or OnlineTrainer(cfg.learned)) if n == "learned" else None,
                      isolate_s=cfg.plugin_timeout_s)
                for n in cfg.estimators]
        learners = [e for e in ests if isinstance(e, LearnedTTFT)]
        trainers.extend(e.trainer for e in learners)
        rate = RateTracker(cfg.ewma_tau_s)
        exp_step = profile.expected(walk.steps) if len(walk.steps) else np.zeros(0)
        cum = np.cumsum(profile.step_gap_s + exp_step)
        ft = first_token_steps(walk, len(reqs))
        speeds = (running_factors(step_log_ratios(profile, walk.steps, cfg.online_speed), cfg.online_speed)
                  if cfg.online_speed is not None else None)
        warm = set()
        span = score_span(walk.start, walk.end, cfg.score_window)
        for idx, snap in walk.queries():
            snap.arrival_rate = rate.rate(snap.t)
            rate.observe(snap.t)
            if progress is not None:
                progress(1)
            q = Query(idx, snap.t, int(walk.prompt[idx]))
            if not np.isfinite(ttft[idx]) or ttft[idx] <= 0 or not span[0] <= snap.t < span[1]:
                for est in learners:  # not scored, yet it teaches once its first token is out (a training window)
                    teach(est, snap, q, ttft[idx])
                continue
            residents, waiting = snap.residents, snap.queued
            speed = 1.0 if speeds is None else float(speeds[walk.k])  # steps 0..k-1 have completed
            for est in ests:
                try:
                    value, dt, qs = timed_estimate(est, snap, q, speed, warm, warmup_us)
                except plugins.PluginError as e:  # a plug-in failed: say at which request
                    raise e.at_request(rid[idx]) from None
                rows.append((rid[idx], inst, est.name, ttft[idx], value, residents, waiting, dt, *qs, share[idx]))
                sources.append(getattr(est, "last_source", est.name))
                if isinstance(est, LearnedTTFT):
                    teach(est, snap, q, ttft[idx])
                if est.name == "sfs":
                    f = ft[idx]
                    k0 = walk.k
                    if f >= 0 and f >= k0:
                        if snap.infl_start is not None:
                            ref = max(exp_step[k0] * speed - snap.elapsed, 0.0) + (cum[f] - cum[k0]) * speed
                        else:
                            ref = (cum[f] - (cum[k0 - 1] if k0 > 0 else 0.0)) * speed
                        ref += cfg.frontend_overhead_s + joining_intake(profile.intake, snap, q.prompt)
                        attr.append((rid[idx], inst, ttft[idx], value, ref, est.last_steps, f - k0 + 1))
                        floor_parts.append((k0, f, snap.elapsed if snap.infl_start is not None else None))
        if floor_parts:
            floors.append(jitter_floor(profile, walk.steps, floor_parts, cfg.frontend_overhead_s))
            floor_parts = []
    est_df = pd.DataFrame(rows, columns=["request_id", "instance_id", "estimator", "true_s", "est_s", "residents",
                                         "waiting", "est_us", "p50_s", "p90_s", "p99_s", "cached_share"])
    if any(n == "learned" for n in cfg.estimators):
        est_df["source"] = sources
    att_df = pd.DataFrame(attr, columns=["request_id", "instance_id", "true_s", "sfs_s", "reference_s",
                                         "sim_steps", "real_steps"])
    raw_coverage = None
    if cfg.recalibration is not None:
        raw_coverage = {str(n): c for n, g in est_df.groupby("estimator", sort=False)
                        if (c := coverage(g)) is not None}
        est_df = recalibrated(est_df, reqs.set_index("request_id")["arrival_s"], cfg.recalibration)
    metrics = summarize(est_df, att_df)
    if raw_coverage is not None:
        metrics["recalibration"] = {"step": cfg.recalibration.step, "learns_from": "first tokens before each arrival"}
        for name, c in raw_coverage.items():
            metrics["estimators"][name]["coverage_raw"] = c
    metrics["lengths"] = lengths.policy
    if "lps" in cfg.estimators:
        metrics["lps_arrival_rate"] = (f"online: each instance's EWMA (tau {cfg.ewma_tau_s:g} s) of the arrivals "
                                       "routed to it before the query" if online_lps
                                       else "the calibration traces' mean arrival rate")
    if cfg.score_window is not None:
        metrics["score_window"] = list(cfg.score_window)
    metrics["policies"] = {"lengths": lengths.record()}
    if floors and "sfs_attribution" in metrics:
        apes = np.concatenate(floors)
        metrics["sfs_attribution"]["jitter_floor_mape"] = float(np.mean(apes))
    for name, us in warmup_us.items():
        metrics["estimators"].setdefault(name, {})["warmup_us"] = us
    if trainers and "learned" in metrics["estimators"]:
        metrics["estimators"]["learned"]["training"] = training_summary(trainers, est_df, cfg.learned)
    return EstimateResult(est_df, att_df, metrics)


QUANTILE_COLUMNS = ["p50_s", "p90_s", "p99_s"]
RAW_QUANTILE_COLUMNS = ["p50_raw_s", "p90_raw_s", "p99_raw_s"]  # the model's own, beside recalibrated ones


def recalibrated(est: pd.DataFrame, arrival_s: pd.Series, cfg: RecalibrationConfig) -> pd.DataFrame:
    """The estimates with each distribution's quantiles recalibrated online,
    per instance and estimator, from the requests whose first token came
    before each arrival; the model's own quantiles kept as ``RAW_QUANTILE_COLUMNS``."""
    out = est.copy()
    out[RAW_QUANTILE_COLUMNS] = est[QUANTILE_COLUMNS].to_numpy()
    arrival = arrival_s.loc[est["request_id"]].to_numpy(dtype=np.float64)
    quantiles = est[QUANTILE_COLUMNS].to_numpy(dtype=np.float64)
    true = est["true_s"].to_numpy(dtype=np.float64)
    for _, idx in est.groupby(["instance_id", "estimator"], sort=False).indices.items():
        q = quantiles[idx]
        if np.isfinite(q).all(axis=1).any():
            out.loc[out.index[idx], QUANTILE_COLUMNS] = recalibrate(arrival[idx], true[idx], q, cfg)
    return out


def score_span(start: np.ndarray, end: np.ndarray, window: tuple[float, float] | None) -> tuple[float, float]:
    """Arrival times [from, to) whose requests are scored: from the start of
    step floor(A*n) to the start of step floor(B*n) (the end of the last step
    when B = 1), steps in order; everything without a window."""
    if window is None or not len(start):
        return -np.inf, np.inf
    n = len(start)
    lo, hi = step_window(n, window)
    t_lo = -np.inf if lo == 0 else float(start[lo])
    t_hi = np.inf if hi >= n else float(start[hi])
    return t_lo, t_hi


def summarize(est: pd.DataFrame, att: pd.DataFrame) -> dict:
    out: dict = {"estimators": {}, "requests": int(est["request_id"].nunique()) if len(est) else 0}
    for name, g in est.groupby("estimator", sort=False):
        ok = np.isfinite(g["est_s"].to_numpy())
        s = error_summary(g["est_s"].to_numpy()[ok], g["true_s"].to_numpy()[ok])
        s["n_infinite"] = int((~ok).sum())
        s["mean_us"] = float(g["est_us"].mean())
        s["median_us"] = float(g["est_us"].median())
        bins = {}
        lb = load_bin(g["residents"].to_numpy())
        for label in dict.fromkeys(sorted(set(lb), key=lambda x: int(x.split("-")[0].rstrip("+")))):
            m = (lb == label) & ok
            e = error_summary(g["est_s"].to_numpy()[m], g["true_s"].to_numpy()[m])
            bins[label] = {k: e.get(k) for k in ("n", "mape", "median_ape", "p90_ape")}
        s["by_load"] = bins
        if "cached_share" in g and g["cached_share"].notna().any():
            s["by_cached_share"] = error_by_cached_share(g["est_s"].to_numpy()[ok], g["true_s"].to_numpy()[ok],
                                                         g["cached_share"].to_numpy()[ok])
        cov = coverage(g)
        if cov is not None:
            s["coverage"] = cov
            s["pinball_s"] = pinball(g)
        out["estimators"][str(name)] = s
    if len(att):
        ref, sfs, true = att["reference_s"].to_numpy(), att["sfs_s"].to_numpy(), att["true_s"].to_numpy()
        ok = np.isfinite(sfs) & (ref > 0)
        out["sfs_attribution"] = {
            "n": int(ok.sum()),
            "trajectory_error": float(np.mean(np.abs(sfs[ok] - ref[ok]) / ref[ok])),
            "time_model_error": float(np.mean(np.abs(ref[ok] - true[ok]) / true[ok])),
            "total_mape": float(np.mean(np.abs(sfs[ok] - true[ok]) / true[ok])),
            "mean_sim_steps": float(att["sim_steps"].mean()),
            "mean_real_steps": float(att["real_steps"].mean()),
        }
    return out
