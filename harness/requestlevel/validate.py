"""Twin fidelity on a request-level trace (no steps, no instances table).

The trace's arrivals are replayed on one twin instance configured by
``harness.requestlevel.engine_options`` and timed by the profile, with the profile's
fitted front-end overhead added to every TTFT and, when the profile names
one, the serial API front end (``harness.requestlevel.frontend``) between the client's
arrivals and the engine's. The twin's per-request TTFT
is compared with the measured one (per-request APE) and the two
distributions are compared (mean, p50, p90, p99 and the two-sample KS
statistic), and the same for TPOT (mean time per output token after the
first) and end-to-end latency where the trace has ``finish_s``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from estimators.engine.config import InstanceConfig
from estimators.evaluate.accuracy import error_summary
from estimators.timemodel.profile import BatchTimeProfile
from harness.requestlevel.fleet import FleetSpec
from harness.requestlevel.frontend import FrontEnd
from harness.requestlevel.replay import replay_requests
from harness.requestlevel.request_trace import PREFIX_CACHE, RequestTrace, tpot_of, window_mask  # noqa: F401 (kept importable from here)
from harness.twin.simulation import TwinResult
from traces.store import Trace

QUANTILES = (50, 90, 99)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic (sup distance of the ECDFs)."""
    a, b = np.sort(a[np.isfinite(a)]), np.sort(b[np.isfinite(b)])
    if not a.size or not b.size:
        return float("nan")
    x = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, x, side="right") / a.size
                               - np.searchsorted(b, x, side="right") / b.size)))


def compare(measured: np.ndarray, twin: np.ndarray) -> dict:
    """Per-request APE and the distributions side by side (NaN pairs dropped)."""
    ok = np.isfinite(measured) & np.isfinite(twin) & (measured > 0)
    m, t = measured[ok], twin[ok]
    if not ok.any():
        return {"n": 0}
    e = error_summary(t, m)
    dist = {}
    for name, fm, ft in [("mean", m.mean(), t.mean())] + [(f"p{q}", np.percentile(m, q), np.percentile(t, q))
                                                            for q in QUANTILES]:
        dist[name] = {"measured": float(fm), "twin": float(ft), "error": float((ft - fm) / fm) if fm else None}
    return {"n": int(ok.sum()), "mape": e["mape"], "median_ape": e["median_ape"], "p90_ape": e["p90_ape"],
            "distribution": dist, "ks": ks_statistic(m, t)}


@dataclass
class RequestValidation:
    metrics: dict
    per_request: pd.DataFrame
    twin: TwinResult


def validate_requests(rt: RequestTrace, profile: BatchTimeProfile, engine: InstanceConfig, overhead_s: float,
                      record_steps: bool = True, noise: bool = False, seed: int = 0,
                      virtual_engines: int = 1, frontend: FrontEnd | None = None,
                      score_window: tuple[float, float] | None = None) -> RequestValidation:
    """Replay every request; score those in ``score_window`` (``window_mask``; all without one)."""
    fe = frontend or FrontEnd()
    res = replay_requests(rt, profile, engine, overhead_s, record_steps, noise, seed, virtual_engines, fe)
    rec = rt.requests
    arr = rec["arrival_s"].to_numpy(dtype=np.float64)
    ttft_m = rec["ttft_s"].to_numpy(dtype=np.float64)
    ttft_t = res.requests["ttft_s"].to_numpy(dtype=np.float64)
    fin_m = rec["finish_s"].to_numpy(dtype=np.float64) if "finish_s" in rec else None
    # the twin's finish excludes the front end; the measured one (client side) includes it
    fin_t = res.requests["finish_s"].to_numpy(dtype=np.float64) + overhead_s
    per = pd.DataFrame({
        "request_id": rec["request_id"].to_numpy(), "arrival_s": arr,
        "prompt_tokens": rec["prompt_tokens"].to_numpy(), "output_tokens": rec["output_tokens"].to_numpy(),
        "ttft_true_s": ttft_m, "ttft_twin_s": ttft_t,
        "tpot_true_s": tpot_of(rec, ttft_m, fin_m), "tpot_twin_s": tpot_of(rec, ttft_t, fin_t),
        "e2e_true_s": (fin_m - arr) if fin_m is not None else np.nan, "e2e_twin_s": fin_t - arr,
        "preemptions_twin": res.requests["preemptions"].to_numpy(),
        "instance_twin": res.requests["instance_id"].to_numpy(),
    })
    with np.errstate(invalid="ignore", divide="ignore"):
        per["ape"] = np.abs(per["ttft_twin_s"] - per["ttft_true_s"]) / per["ttft_true_s"]
    per["scored"] = window_mask(len(per), score_window)
    sc = per[per["scored"]]
    metrics = {
        "profile": {"name": profile.name, "form": profile.form, "fitted_on": profile.fitted_on.get("traces")},
        "engine": {k: v for k, v in engine.to_row().items() if k not in ("price_in", "price_out", "device")},
        "frontend_overhead_s": overhead_s, "frontend": fe.to_json(), "virtual_engines": virtual_engines, "prefix_cache": rt.prefix_cache,
        "warm_hits": res.extra["warm_hits"], "deliveries": res.extra["deliveries"],
        "noise": noise, "seed": seed,
        "requests": int(len(per)), "steps": {"recorded": 0, "twin": int(res.steps_run)},
        "request_level": True,
        **({"score_window": list(score_window), "scored_requests": int(len(sc))} if score_window is not None else {}),
        "ttft": compare(sc["ttft_true_s"].to_numpy(dtype=np.float64), sc["ttft_twin_s"].to_numpy(dtype=np.float64)),
        "tpot": compare(sc["tpot_true_s"].to_numpy(), sc["tpot_twin_s"].to_numpy()),
        "e2e": compare(sc["e2e_true_s"].to_numpy(dtype=np.float64), sc["e2e_twin_s"].to_numpy()),
        "rejected_twin": res.extra.get("rejected", 0),
        "fleet": res.extra.get("fleet"),
    }
    return RequestValidation(metrics, per, res)


@dataclass
class AssignmentValidation:
    """A validation of one trace under each distinct assignment of a
    fleet's seeds (one run when the log names its instances, when the fleet
    is one engine, or when every seed gives one partition)."""

    runs: list[RequestValidation]
    seeds: int  # the seeds the runs stand for

    @property
    def median(self) -> RequestValidation:
        """The run whose TTFT mean error is the median (the lower of two)."""
        order = sorted(range(len(self.runs)), key=lambda i: (_err(self.runs[i].metrics, "ttft", "mean"), i))
        return self.runs[order[(len(order) - 1) // 2]]

    def spread(self) -> dict | None:
        """min/median/max over the runs of the headline errors (None for one engine)."""
        fleet = self.runs[0].metrics.get("fleet")
        if fleet is None:
            return None
        out = {"replicas": fleet["replicas"], "assign": fleet["assign"], "seeds": self.seeds,
               "distinct_assignments": len(self.runs)}
        for key, q in SPREAD:
            v = np.array([_err(r.metrics, key, q) for r in self.runs], dtype=np.float64)
            v = v[np.isfinite(v)]
            if v.size:
                out[f"{key}_{q}_error"] = [float(v.min()), float(np.median(v)), float(v.max())]
        return out


SPREAD = (("ttft", "mean"), ("ttft", "p90"), ("ttft", "mape"), ("tpot", "mean"), ("e2e", "mean"))


def _err(m: dict, key: str, q: str) -> float:
    c = m.get(key) or {}
    if not c.get("n"):
        return float("nan")
    if q == "mape":
        return float(c["mape"])
    e = c["distribution"][q]["error"]
    return float("nan") if e is None else float(e)


def validate_assignments(rts: list[RequestTrace], profile: BatchTimeProfile, engine: InstanceConfig,
                         overhead_s: float, seeds: int = 1, **kw) -> AssignmentValidation:
    """``validate_requests`` of each of ``rts`` (one trace under each
    assignment, ``RequestTrace.under``)."""
    return AssignmentValidation([validate_requests(rt, profile, engine, overhead_s, **kw) for rt in rts], seeds)


def format_assignments(v: AssignmentValidation) -> list[str]:
    """The median run's lines and, for a fleet, the spread over its assignments."""
    lines = format_request_metrics(v.median.metrics)
    s = v.spread()
    if s is None:
        return lines
    served = v.median.metrics["fleet"].get("requests_per_replica", {})
    head = (f"fleet   {s['replicas']} replicas, assignment {s['assign']}: " +
            ("the log's own" if s["assign"] == "logged" else
             f"{s['seeds']} seed(s), {s['distinct_assignments']} distinct assignment(s)")
            + (f"; requests per replica {'/'.join(str(c) for c in served.values())}" if served else ""))
    lines.append(head)
    if s["distinct_assignments"] > 1:
        lines.append("        over the assignments, min/median/max: " + "  ".join(
            f"{key.upper()} {q} {'/'.join(f'{100 * x:.1f}' if q == 'mape' else f'{100 * x:+.1f}' for x in s[f'{key}_{q}_error'])}%"
            for key, q in SPREAD if f"{key}_{q}_error" in s))
    return lines


def format_request_metrics(m: dict) -> list[str]:
    lines = []
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E")):
        c = m.get(key) or {}
        if not c.get("n"):
            continue
        d = c["distribution"]
        lines.append(f"{label:<5} MAPE {100 * c['mape']:.1f}%  median APE {100 * c['median_ape']:.1f}%  "
                     f"p90 APE {100 * c['p90_ape']:.1f}%  KS {c['ks']:.3f}  over {c['n']} requests")
        lines.append("      " + "  ".join(f"{q} {1e3 * d[q]['measured']:.1f}/{1e3 * d[q]['twin']:.1f} ms "
                                          f"({100 * d[q]['error']:+.1f}%)" for q in d) + "  (measured/twin)")
    return lines


def validate_request_trace(trace: Trace, trace_dir, profile: BatchTimeProfile, engine_opts: tuple[str, ...],
                           noise: bool, seed: int, out, force: bool, echo,
                           prefix_cache: str = "cold",
                           score_window: tuple[float, float] | None = None,
                           fleet: FleetSpec | None = None, frontend: FrontEnd | None = None,
                           overhead_s: float | None = None) -> RequestValidation:
    """``validate`` on a request-level trace: checks, replay, metrics.json,
    requests.parquet, ttft_cdf.png (measured vs twin TTFT CDFs) and the
    twin's trace (with steps) under twin/.

    ``fleet``: the replicas the log came from (``--pool``, ``--replicas``;
    None: the profile's fit's fleet, else one engine); ``frontend`` and
    ``overhead_s``: a pool's (None: the profile's). A fleet whose log does
    not name its instances is scored under each distinct assignment of its
    seeds (the median run's figures, the spread beside them), and the
    replicas the run's completions imply are found (``active_replicas``): a
    run that part of the fleet served is replayed on that part, the full
    fleet's figures shown beside."""
    import time
    from pathlib import Path

    from harness.requestlevel.active_replicas import ActiveReplicas, implied_replicas
    from harness.requestlevel.engine_options import (
        frontend_of,
        frontend_overhead,
        marks_json,
        marks_summary,
        parse_engine_options,
        refuse_unservable,
        request_engine_marked,
        trace_caveats,
        trace_engine,
        virtual_engines,
    )
    from harness.requestlevel.fleet import LOGGED, logged_instances
    from harness.requestlevel.score_window import refuse_small_window
    from harness.twin.pools.memory import refuse_engine_memory
    from harness.twin.simulation import write_twin_trace
    from reports.request_cdf import ttft_cdf_figure
    from reports.results import result_header
    from traces.files.outputs import StagedDir, write_json, write_parquet
    from traces.store import TraceWriter

    spec = fleet or FleetSpec.from_json(profile.fitted_on.get("fleet"), f"profile {profile.name}'s fit") or FleetSpec()
    options = {**spec.engine, **parse_engine_options(engine_opts)}
    stated = trace_engine([trace])
    engine, marks = request_engine_marked(profile, options, stated=stated)
    refuse_engine_memory(engine, spec.replicas)
    caveats = trace_caveats([trace])
    rt = RequestTrace.of(trace).warmed(prefix_cache)
    if score_window is not None:  # a window of a handful of requests scores nothing (none: an IndexError)
        timed = np.isfinite(rt.requests["ttft_s"].to_numpy(dtype=np.float64))
        refuse_small_window(int((timed & window_mask(len(timed), score_window)).sum()), int(timed.sum()),
                            score_window, "by arrival")
    under = rt.under(spec)  # a fleet the log contradicts is refused here, before any replay
    refuse_unservable(engine, [rt.requests["prompt_tokens"]], [rt.requests["output_tokens"]], options, f"profile {profile.name}",
                      profile, stated)
    fe = frontend if frontend is not None else frontend_of(profile)
    ov = overhead_s if overhead_s is not None else frontend_overhead(profile)
    ve = virtual_engines(profile)
    kw = {"record_steps": True, "noise": noise, "seed": seed, "virtual_engines": ve, "frontend": fe,
          "score_window": score_window}
    t = time.perf_counter()
    full = validate_assignments(under, profile, engine, ov, spec.seeds, **kw)
    chosen, active = full, None
    logged = logged_instances(rt.requests, rt.source)
    if logged is not None:
        m_inst = int(logged.max()) + 1
        active = ActiveReplicas(max(spec.replicas, m_inst) if spec.stated else m_inst, m_inst, True,
                                "named by the log's instance_id column")
    elif under[0].fleet is not None and under[0].fleet.assign != LOGGED:
        fins = [r.twin.requests["finish_s"].to_numpy(dtype=np.float64) + ov for r in full.runs]
        active = implied_replicas(rt, spec, profile, engine, ov, ve, fe, fins)
        if active.partial:
            from dataclasses import replace

            chosen = validate_assignments(rt.under(replace(spec, replicas=active.implied)), profile, engine, ov,
                                          spec.seeds, **kw)
    v = chosen.median
    m = v.metrics
    m["fleet_spec"] = spec.to_json()
    m["engine_marks"] = marks_json(engine, marks)
    m["caveats"] = caveats
    m["assign_seeds"] = chosen.spread()
    if active is not None:
        m["active_replicas"] = active.to_json()
    if chosen is not full:
        m["full_fleet"] = {"replicas": spec.replicas, "assign_seeds": full.spread(),
                           **{k: full.median.metrics[k] for k in ("ttft", "tpot", "e2e")}}
    from harness.requestlevel.engine_view import engine_view, format_engine_view, has_engine_stamps

    if has_engine_stamps(rt.requests):  # a vLLM run's own stats (vllm-reqstats): the engine's definitions too
        m["engine_view"] = engine_view(rt.requests, v.per_request, v.twin,
                                       trace.read("engine_series") if trace.has("engine_series") else None)
    m["trace"] = str(trace_dir)
    m["wall_s"] = time.perf_counter() - t
    with StagedDir(out, force) as tmp:
        write_json(tmp / "metrics.json", {**result_header("validate"), **m})
        write_parquet(tmp / "requests.parquet", v.per_request)
        ttft_cdf_figure({f"{Path(trace_dir).name}: KS {m['ttft']['ks']:.2f}": tmp}, tmp / "ttft_cdf.png")
        with TraceWriter(tmp / "twin") as w:
            w.meta["source"] = {"kind": "twin", "replay_of": str(trace_dir), "profile": profile.name,
                                "noise": "on" if noise else "off", "seed": seed}
            w.meta["arrivals"] = trace.meta.get("arrivals", "measured")
            write_twin_trace(w, v.twin)
    echo(f"validate {trace_dir} (request-level: no steps) with profile {profile.name}, engine {engine.policy} "
         f"budget {engine.max_num_batched_tokens} max_num_seqs {engine.max_num_seqs}, front end "
         f"{1e3 * m['frontend_overhead_s']:.1f} ms + {1e3 * m['frontend']['per_request_s']:.2f} ms per request "
         f"and {1e3 * m['frontend'].get('per_output_s', 0.0):.3f} ms per delivered token queued, "
         f"{m['virtual_engines']} virtual engine(s), prefix cache {rt.prefix_cache}, noise {'on' if noise else 'off'}")
    for line in marks_summary(m["engine_marks"], caveats):
        echo(line)
    echo(f"fleet: {spec.replicas} replica(s) ({spec.source})"
         + (f", assignment {spec.assign} ({spec.seeds} seed(s))" if spec.assign and logged is None else "")
         + (", each request's instance named by the log" if logged is not None else ""))
    if active is not None:
        echo(active.line())
    if score_window is not None:
        echo(f"scored: requests {score_window[0]:g}:{score_window[1]:g} by arrival ({m['scored_requests']} of "
             f"{m['requests']}); the twin replayed all of them")
    for line in format_assignments(chosen):
        echo(line)
    if chosen is not full:
        echo(f"the full fleet ({spec.replicas} replicas), beside:")
        for line in format_assignments(full):
            echo("  " + line)
    if "engine_view" in m:
        for line in format_engine_view(m["engine_view"]):
            echo(line)
    echo(f"wrote {out}")
    return v
