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

from estimators.accuracy import error_summary
from estimators.engine.config import InstanceConfig
from estimators.profile import BatchTimeProfile
from harness.requestlevel.cache import given_hits, warm_fits, warm_input
from harness.requestlevel.delivery import replay_with_deliveries
from harness.requestlevel.frontend import FrontEnd
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig, TwinResult, fixed_router, shortest_queue_router
from traces.errors import BadInput
from traces.store import Trace

QUANTILES = (50, 90, 99)
# cold: no prompt is cached. warm: every prompt's full blocks are in vLLM's
# prefix cache when it arrives -- the case of a benchmark that replays the
# same prompts on a server that ran them before (V1 caches prefixes by
# default, and the A100 runs at 4, 16 q/s and all at once followed the 1 q/s
# run on the same server with the same 200 prompts).
PREFIX_CACHE = ("cold", "warm")


@dataclass
class RequestTrace:
    """The columns a request-level replay needs, checked."""

    requests: pd.DataFrame  # request_id, arrival_s, prompt_tokens, output_tokens, ttft_s[, finish_s]
    source: str
    prefix_cache: str = "cold"  # PREFIX_CACHE

    def warmed(self, mode: str) -> RequestTrace:
        if mode not in PREFIX_CACHE:
            raise ValueError(f"prefix cache must be one of {', '.join(PREFIX_CACHE)}, not {mode!r}")
        return RequestTrace(self.requests, self.source, mode)

    def windowed(self, window: tuple[float, float] | None) -> RequestTrace:
        """The trace with the measured timings (``ttft_s``, ``finish_s``) of the requests outside
        ``window`` (a share A:B of its requests in arrival order, ``window_mask``) blanked: every
        request is still replayed with its arrival and lengths, only the window's timings are known
        to a fit."""
        if window is None:
            return self
        keep = window_mask(len(self.requests), window)
        reqs = self.requests.copy()
        for col in ("ttft_s", "finish_s"):
            if col in reqs:
                reqs.loc[~keep, col] = np.nan
        if not np.isfinite(reqs["ttft_s"].to_numpy(dtype=np.float64)).any():
            raise BadInput(self.source, None, "ttft_s", f"no measured TTFT in the window {window[0]:g}:{window[1]:g}")
        return RequestTrace(reqs, self.source, self.prefix_cache)

    def timed(self) -> int:
        """Requests with a measured TTFT (all of them, or a fit window's)."""
        return int(np.isfinite(self.requests["ttft_s"].to_numpy(dtype=np.float64)).sum())

    @classmethod
    def of(cls, trace: Trace) -> RequestTrace:
        f = trace.file("requests")
        if not trace.has("requests"):
            raise BadInput(f, None, "requests", "a request-level trace needs this table")
        reqs = trace.read("requests")
        return cls.from_frame(reqs, str(f))

    @classmethod
    def from_frame(cls, reqs: pd.DataFrame, source: str) -> RequestTrace:
        if "ttft_s" not in reqs or not np.isfinite(reqs["ttft_s"].to_numpy(dtype=np.float64)).any():
            raise BadInput(source, None, "ttft_s", "no measured TTFT: nothing to calibrate or validate against")
        for col in ("arrival_s", "prompt_tokens", "output_tokens"):
            if col not in reqs or reqs[col].isna().any():
                raise BadInput(source, None, col, "every request needs it to be replayed")
        _check_served(reqs, source)
        reqs = reqs.sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)
        return cls(reqs, source)

    def tpot(self) -> np.ndarray:
        """Measured mean time per output token after the first (NaN without finish_s)."""
        return tpot_of(self.requests, self.requests["ttft_s"].to_numpy(dtype=np.float64),
                       self.requests["finish_s"].to_numpy(dtype=np.float64) if "finish_s" in self.requests else None)


def window_mask(n: int, window: tuple[float, float] | None) -> np.ndarray:
    """Requests ``[floor(A n), floor(B n))`` of ``n`` in arrival order (all without a window): the
    split ``calibrate --from-requests --fit-window`` and ``validate --score-window`` share, so 0:0.5
    and 0.5:1 are complements."""
    keep = np.ones(n, dtype=bool)
    if window is not None:
        lo, hi = int(np.floor(window[0] * n)), int(np.floor(window[1] * n + 1e-9))
        keep[:] = False
        keep[lo:hi] = True
    return keep


def _check_served(reqs: pd.DataFrame, source: str) -> None:
    """What every measured request of a served trace satisfies, checked at
    the entry (rows are the table's, 1-based): at least one output token
    (the TTFT is that token's), and a finish not before the first token.
    A row breaking either is a corruption the twin cannot be fitted to (it
    once surfaced as a missing steps table of a temporary reconstruction)."""
    out = reqs["output_tokens"].to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~(out >= 1))
    if bad.size:
        raise BadInput(source, int(bad[0]) + 1, "output_tokens", f"{out[bad[0]]:g}: a served request has at least "
                                                                 "one output token")
    if "finish_s" in reqs:
        first = reqs["arrival_s"].to_numpy(dtype=np.float64) + reqs["ttft_s"].to_numpy(dtype=np.float64)
        fin = reqs["finish_s"].to_numpy(dtype=np.float64)
        bad = np.flatnonzero(np.isfinite(first) & np.isfinite(fin) & (fin < first - 1e-9))
        if bad.size:
            i = int(bad[0])
            raise BadInput(source, i + 1, "finish_s", f"{fin[i]:g} is before the first token (arrival + TTFT = "
                                                      f"{first[i]:g})")


def tpot_of(reqs: pd.DataFrame, ttft: np.ndarray, finish: np.ndarray | None) -> np.ndarray:
    n = len(reqs)
    if finish is None:
        return np.full(n, np.nan)
    out = reqs["output_tokens"].to_numpy(dtype=np.float64)
    dec = finish - reqs["arrival_s"].to_numpy(dtype=np.float64) - ttft
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(out > 1, dec / (out - 1), np.nan)


def replay_requests(rt: RequestTrace, profile: BatchTimeProfile, engine: InstanceConfig, overhead_s: float,
                    record_steps: bool = False, noise: bool = False, seed: int = 0,
                    virtual_engines: int = 1, frontend: FrontEnd | None = None) -> TwinResult:
    """Replay the arrivals on one instance (every request to it).

    ``frontend`` (``harness.requestlevel.frontend``) turns the client's arrivals into
    the engine's; TTFTs are from the client's arrival, as measured, and
    ``added_s`` is when the engine got the request. With a delivery cost
    (``harness.requestlevel.delivery``) ``ttft_s`` and ``finish_s`` are when the
    client gets the first and the last token, as measured. A warm trace replays
    its prompts' warm-up first (``harness.requestlevel.cache``; hits handed
    over outright when they cannot all fit in the cache); the result's
    ``requests`` are the trace's rows only, on the trace's clock (the
    warm-up is in ``extra["warmup"]``, and it and the log are on the
    replay's clock, ``extra["time_shift_s"]`` later).

    ``virtual_engines`` > 1 models vLLM V0's pipeline parallelism: with
    ``pipeline_parallel_size`` N the engine keeps N schedulers ("virtual
    engines"), each running its own batch through the pipeline, and gives a
    new request to the one with the fewest unfinished requests. Each is a
    twin instance with the full step time; requests go to the one with the
    fewest residents (ties: lowest index)."""
    from dataclasses import replace

    fe = frontend or FrontEnd()
    base = replace_profile_name(engine, profile)
    reqs = rt.requests[["request_id", "arrival_s", "prompt_tokens", "output_tokens"]].copy()
    client = reqs["arrival_s"].to_numpy(dtype=np.float64)
    n_warm, per_engine, block_tokens, shift, hits = 0, 1, None, 0.0, None
    prompts = reqs["prompt_tokens"].to_numpy()
    warm_hits = rt.prefix_cache == "warm" and not warm_fits(prompts, base.block_size, base.num_kv_blocks)
    if warm_hits:
        hits = given_hits(prompts)
    elif rt.prefix_cache == "warm":
        w = warm_input(reqs, base.block_size, virtual_engines)
        n_warm, per_engine, shift, reqs = w.n_warm, max(w.per_engine, 1), w.shift_s, w.requests
        base, block_tokens = replace(base, prefix_caching=True), base.block_size
    if virtual_engines == 1:
        specs = [InstanceSpec(base, profile)]
        router = fixed_router(np.zeros(len(reqs), dtype=np.int64))
    else:
        specs = [InstanceSpec(replace(base, instance_id=f"{base.instance_id}.v{k}"), profile)
                 for k in range(virtual_engines)]

        def router(i: int, t: float, insts: list) -> int:  # the warm-up: every prompt on every engine
            return i // per_engine if i < n_warm else shortest_queue_router(i, t, insts)
    twin = Twin(specs, TwinConfig(seed=seed, noise=noise, record_steps=record_steps or fe.delivers,
                                  frontend_overhead_s=overhead_s))

    def run(entry: np.ndarray) -> tuple[TwinResult, np.ndarray, np.ndarray]:
        r = reqs.copy()
        r.loc[n_warm:, "arrival_s"] = entry + shift  # the warm-up rows keep theirs
        res = twin.run(r, router, hits=hits, hash_block_tokens=block_tokens)
        t = res.requests["ttft_s"].to_numpy(dtype=np.float64)[n_warm:]
        fin = res.requests["finish_s"].to_numpy(dtype=np.float64)[n_warm:] - shift
        return res, entry + t - overhead_s, fin  # the engine's first and last tokens, on the trace's clock

    if fe.delivers:
        res, entry, dl = replay_with_deliveries(run, client, fe, shift)
        first_t, finish = dl.first_token_s, dl.last_token_s
        delivery = {"rounds": dl.rounds, "unsettled_s": dl.moved_s}
    else:
        entry = fe.engine_arrivals(client)
        res, first_t, finish = run(entry)
        delivery = None
    out = res.requests.iloc[n_warm:].reset_index(drop=True)
    out["arrival_s"] = client
    out["ttft_s"] = first_t - client + overhead_s
    out["added_s"] = entry
    out["finish_s"] = finish
    warm = None if rt.prefix_cache == "cold" else ("outright" if hits is not None else "engine cache")
    return replace(res, requests=out, extra={**res.extra, "warmup": res.requests.iloc[:n_warm], "time_shift_s": shift,
                                             "warm_hits": warm, "deliveries": delivery})


def replace_profile_name(engine: InstanceConfig, profile: BatchTimeProfile) -> InstanceConfig:
    from dataclasses import replace

    return replace(engine, profile=engine.profile or profile.name, model=engine.model or profile.name)


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
    }
    return RequestValidation(metrics, per, res)


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
                           score_window: tuple[float, float] | None = None) -> RequestValidation:
    """``validate`` on a request-level trace: checks, replay, metrics.json,
    requests.parquet, ttft_cdf.png (measured vs twin TTFT CDFs) and the
    twin's trace (with steps) under twin/."""
    import time
    from pathlib import Path

    from harness.requestlevel.engine_options import (
        frontend_of,
        frontend_overhead,
        parse_engine_options,
        refuse_unservable,
        request_engine,
        trace_engine,
        virtual_engines,
    )
    from harness.twin.simulation import write_twin_trace
    from reports.request_cdf import ttft_cdf_figure
    from reports.results import result_header
    from traces.outputs import StagedDir, write_json, write_parquet
    from traces.store import TraceWriter

    options = parse_engine_options(engine_opts)
    engine = request_engine(profile, options, stated=trace_engine([trace]))
    rt = RequestTrace.of(trace).warmed(prefix_cache)
    refuse_unservable(engine, [rt.requests["prompt_tokens"]], [rt.requests["output_tokens"]], options, f"profile {profile.name}",
                      profile)
    t = time.perf_counter()
    v = validate_requests(rt, profile, engine, frontend_overhead(profile), record_steps=True, noise=noise, seed=seed,
                          virtual_engines=virtual_engines(profile), frontend=frontend_of(profile),
                          score_window=score_window)
    m = v.metrics
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
    if score_window is not None:
        echo(f"scored: requests {score_window[0]:g}:{score_window[1]:g} by arrival ({m['scored_requests']} of "
             f"{m['requests']}); the twin replayed all of them")
    for line in format_request_metrics(m):
        echo(line)
    if "engine_view" in m:
        for line in format_engine_view(m["engine_view"]):
            echo(line)
    echo(f"wrote {out}")
    return v
