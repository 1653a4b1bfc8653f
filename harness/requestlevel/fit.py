"""``calibrate --from-requests``: a batch-time profile from request-level
traces (arrivals, lengths, measured TTFT and end times; no engine steps).

Fitted: the ``six`` form's step cost ``const + P*prefill_tokens +
D*decode_tokens + sum_ctx*cached_tokens`` (the two square terms stay 0:
ShareGPT-sized prompts do not reveal them) and the front end's overhead
added to every TTFT; optionally the engine's token budget and
``max_num_seqs``. Everything fitted travels in the profile
(``fitted_on.engine``, ``fitted_on.request_fit``).

How, in three stages:

1. *Decode* from TPOTs. A request's mean inter-token time is the mean step
   time while it decodes (an ITL is one or more step times). Over the
   measured decode intervals we know how many requests decoded alongside
   and their context, so ``TPOT_i ~ const + D*n_i + sum_ctx*ctx_i`` is a
   small least-squares problem.
2. *Prefill* from TTFTs at low load: ``TTFT_i ~ overhead + step(prompt_i)``
   where little else runs; its slope is ``P``.
3. *The twin in the loop*: Nelder-Mead on the log of the five values,
   each evaluation replaying every trace's arrivals on the twin (noise
   off) and scoring TTFT quantiles (p10..p99), per-request TTFT and TPOT
   log errors: a first round from each of two starts (``starts``), then
   restarts around the better one. With ``search_engine`` a grid (by default budget x
   max_num_seqs; ``--search KEY=v1,v2`` for any engine setting, e.g.
   ``num_kv_blocks``)
   is scored at the fitted values, the best kept, and the search repeated.

The optimiser is our own (``simplex.py``).
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from estimators.batch_features import term_names
from estimators.batch_fit import NoiseModel
from estimators.engine.config import InstanceConfig
from estimators.profile import BatchTimeProfile
from harness.requestlevel.frontend import FrontEnd
from harness.requestlevel.simplex import nelder_mead
from harness.requestlevel.validate import RequestTrace, replay_requests, tpot_of
from traces.errors import BadInput

FORM = "six"
PARAMS = ("const", "P", "D", "sum_ctx", "frontend_overhead_s")
# ``fit_host``: the host's part of a step (``docs/concepts/batch-time.md``) fitted too: the inter-step gap
# and the host's share of a step's time, which only an engine with async scheduling tells apart from the
# device's (without it the two add up and only their sum shows)
HOST_PARAMS = ("step_gap_s", "host_share")
HOST_START = (1e-3, 0.05)
MAX_HOST_SHARE = 0.9
TTFT_QUANTILES = (10, 25, 50, 75, 90, 99)
BUDGETS = (512, 1024, 2048, 4096, 8192, 16384)
MAX_SEQS = (16, 32, 64, 128, 256, 512)


@dataclass
class RequestFitConfig:
    max_evals: int = 120
    rounds: int = 3  # restarts of the simplex around the best point
    search_engine: bool = False  # search ``grid`` (default: budget x max_num_seqs)
    grid: dict = field(default_factory=dict)  # engine field -> candidate values
    virtual_engines: int = 1  # V0 pipeline parallelism (see request_validate.replay_requests)
    fit_host: bool = False  # fit the host's part too (HOST_PARAMS)
    frontend: FrontEnd = field(default_factory=FrontEnd)  # serial front end (fixed, never fitted here)
    budgets: tuple[int, ...] = BUDGETS
    max_seqs: tuple[int, ...] = MAX_SEQS
    weights: dict = field(default_factory=lambda: {"ttft_q": 1.0, "ttft_req": 1.0, "tpot_req": 0.5,
                                                    "tpot_mean": 1.0})


def _intervals_overlap(start: np.ndarray, end: np.ndarray, w: np.ndarray) -> np.ndarray:
    """For each interval i, the time-averaged sum of ``w`` over the intervals alive during it."""
    out = np.zeros(len(start))
    known = np.isfinite(start) & np.isfinite(end)  # outside a fit window the timings are not known
    start, end, w = start[known], end[known], w[known]
    full = out
    out = np.zeros(len(start))
    for i in range(len(start)):
        lo, hi = start[i], end[i]
        if not hi > lo:
            out[i] = np.nan
            continue
        ov = np.clip(np.minimum(end, hi) - np.maximum(start, lo), 0, None)
        out[i] = float((ov * w).sum() / (hi - lo))
    full[:] = np.nan
    full[known] = out
    return full


def initial_guess(traces: list[RequestTrace]) -> np.ndarray:
    """Stages 1 and 2: the five values from TPOTs and low-load TTFTs."""
    rows, y = [], []
    unfinished = None  # a trace that has finish times, none of them usable
    for rt in traces:
        r = rt.requests
        tp = rt.tpot()
        if "finish_s" not in r:
            continue
        arr = r["arrival_s"].to_numpy(dtype=np.float64)
        s = arr + r["ttft_s"].to_numpy(dtype=np.float64)
        e = r["finish_s"].to_numpy(dtype=np.float64)
        ctx = r["prompt_tokens"].to_numpy(dtype=np.float64) + r["output_tokens"].to_numpy(dtype=np.float64) / 2
        n = _intervals_overlap(s, e, np.ones(len(r)))
        c = _intervals_overlap(s, e, ctx)
        ok = np.isfinite(tp) & np.isfinite(n) & (tp > 0)
        if not ok.any():
            unfinished = unfinished or rt  # no request finished after its first token: no decode cost from it
            continue
        rows.append(np.column_stack([np.ones(ok.sum()), n[ok], c[ok]]))
        y.append(tp[ok])
    if rows:
        X, Y = np.vstack(rows), np.concatenate(y)
        coef = np.linalg.lstsq(X / Y[:, None], np.ones(len(Y)), rcond=None)[0]  # relative least squares
        med = float(np.median(Y))
        const = coef[0] if coef[0] > 0 else 0.8 * med
        d = coef[1] if coef[1] > 0 else 0.002 * med
        ctx = coef[2] if coef[2] > 0 else 1e-8
    elif unfinished is not None:
        raise BadInput(unfinished.source, None, "finish_s", "no request finishes after its first token "
                       "(finish_s missing or not after arrival_s + ttft_s): the decode cost cannot be fitted")
    else:
        const, d, ctx = 0.02, 1e-4, 1e-8
    # prefill: the lightest-loaded trace's TTFTs against prompt length
    lo = min(traces, key=lambda t: len(t.requests) / max(np.ptp(t.requests["arrival_s"].to_numpy()), 1e-9))
    p = lo.requests["prompt_tokens"].to_numpy(dtype=np.float64)
    t = lo.requests["ttft_s"].to_numpy(dtype=np.float64)
    ok = np.isfinite(t)
    if not ok.any():
        raise BadInput(lo.source, None, "ttft_s", "no request has a measured TTFT (nothing to fit the prefill cost on)")
    A = np.column_stack([np.ones(ok.sum()), p[ok]])
    a, b = np.linalg.lstsq(A / t[ok][:, None], np.ones(ok.sum()), rcond=None)[0]
    pre = b if b > 0 else 1e-4
    overhead = max(a - const, 1e-3)
    return np.array([const, pre, d, ctx, overhead])


def starts(traces: list[RequestTrace]) -> list[np.ndarray]:
    """Start points of the search: the data-driven guess, and the same with
    the front end at a quarter of the lightest trace's median TTFT (from a
    front end near 0 the log-space simplex can stall many steps away from
    tens of ms; with one prompt length, as in long shared inputs, the
    intercept says nothing). Nelder-Mead is local: the better first round
    is continued."""
    x0 = initial_guess(traces)
    lo = min(traces, key=lambda t: len(t.requests) / max(np.ptp(t.requests["arrival_s"].to_numpy()), 1e-9))
    x1 = x0.copy()
    x1[4] = max(x0[4], 0.25 * float(np.nanmedian(lo.requests["ttft_s"].to_numpy(dtype=np.float64))))
    return [x0] if np.allclose(x0, x1) else [x0, x1]


def profile_of(values: np.ndarray, name: str) -> BatchTimeProfile:
    """The profile of a point of the search: five values, or seven with the host's part (``HOST_PARAMS``;
    the share capped at ``MAX_HOST_SHARE``)."""
    coef = np.zeros(len(term_names(FORM)))
    coef[:4] = values[:4]
    if len(values) > len(PARAMS):
        return BatchTimeProfile(name=name, form=FORM, coefficients=coef, noise=NoiseModel(),
                                step_gap_s=float(min(values[5], 1.0)),
                                host_share=float(min(values[6], MAX_HOST_SHARE)))
    return BatchTimeProfile(name=name, form=FORM, coefficients=coef, noise=NoiseModel())


def param_names(values: np.ndarray) -> tuple[str, ...]:
    return PARAMS + (HOST_PARAMS if len(values) > len(PARAMS) else ())


@dataclass
class TraceTargets:
    rt: RequestTrace
    ttft: np.ndarray
    tpot: np.ndarray
    q: np.ndarray

    @classmethod
    def of(cls, rt: RequestTrace) -> TraceTargets:
        tt = rt.requests["ttft_s"].to_numpy(dtype=np.float64)
        return cls(rt, tt, rt.tpot(), np.nanpercentile(tt, TTFT_QUANTILES))


def _logerr(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    return float(np.mean(np.abs(np.log(a[ok] / b[ok])))) if ok.any() else 10.0


def loss(values: np.ndarray, engine: InstanceConfig, targets: list[TraceTargets], w: dict,
         virtual_engines: int = 1, frontend: FrontEnd | None = None) -> float:
    """Sum over traces of the TTFT-quantile, per-request TTFT/TPOT and mean-TPOT log errors."""
    prof = profile_of(values, "fit")
    total = 0.0
    for tg in targets:
        res = replay_requests(tg.rt, prof, engine, float(values[4]), virtual_engines=virtual_engines,
                              frontend=frontend)
        ttft = res.requests["ttft_s"].to_numpy(dtype=np.float64)
        if not np.isfinite(ttft).all():
            return 1e3
        fin = res.requests["finish_s"].to_numpy(dtype=np.float64) + values[4]
        tp = tpot_of(tg.rt.requests, ttft, fin)
        timed = np.isfinite(tg.ttft)  # a fit window scores its own requests only
        tp = np.where(np.isfinite(tg.tpot), tp, np.nan)
        total += w["ttft_q"] * _logerr(np.percentile(ttft[timed], TTFT_QUANTILES), tg.q)
        total += w["ttft_req"] * _logerr(ttft, tg.ttft)
        if np.isfinite(tg.tpot).any():
            total += w["tpot_req"] * _logerr(tp, tg.tpot)
            total += w["tpot_mean"] * abs(np.log(np.nanmean(tp) / np.nanmean(tg.tpot)))
    return total


@dataclass
class RequestFit:
    profile: BatchTimeProfile
    engine: InstanceConfig
    values: np.ndarray
    loss: float
    evals: int
    wall_s: float
    engine_search: list[dict] = field(default_factory=list)


def _search(engine: InstanceConfig, targets: list[TraceTargets], x0s: list[np.ndarray], cfg: RequestFitConfig):
    f = lambda z: loss(np.exp(z), engine, targets, cfg.weights, cfg.virtual_engines, cfg.frontend)  # noqa: E731
    evals = 0
    firsts = []
    for x0 in x0s:
        z, fz, k = nelder_mead(f, np.log(x0), step=0.5, max_evals=cfg.max_evals)
        evals += k
        firsts.append((fz, z))
    fz, z = min(firsts, key=lambda p: p[0])
    for r in range(1, cfg.rounds):
        z, fz, k = nelder_mead(f, z, step=0.5 if r % 2 == 0 else 0.2, max_evals=cfg.max_evals)
        evals += k
    return np.exp(z), fz, evals


def fit_requests(traces: list[RequestTrace], engine: InstanceConfig, name: str,
                 cfg: RequestFitConfig | None = None) -> RequestFit:
    cfg = cfg or RequestFitConfig()
    t0 = time.perf_counter()
    targets = [TraceTargets.of(rt) for rt in traces]
    x, fx, evals = _search(engine, targets, starts(traces), cfg)
    grid: list[dict] = []
    if cfg.search_engine:
        space = cfg.grid or {"max_num_batched_tokens": cfg.budgets, "max_num_seqs": cfg.max_seqs}
        for combo in itertools.product(*space.values()):
            point = dict(zip(space, combo))
            try:
                e = replace(engine, **point)
                e.to_array()  # refuses what vLLM refuses (e.g. budget < max_num_seqs)
            except ValueError:
                continue
            grid.append({**point, "loss": loss(x, e, targets, cfg.weights, cfg.virtual_engines, cfg.frontend)})
            evals += 1
        best = min(grid, key=lambda g: g["loss"])
        engine = replace(engine, **{k: best[k] for k in space})
        x, fx, k = _search(engine, targets, [x], RequestFitConfig(**{**cfg.__dict__, "rounds": 1}))
        evals += k
    if cfg.fit_host:
        # from the fit without a host part: seven values searched from scratch strayed (on the PRO 6000 run
        # into a 4.8-s front end at 15 times the loss); kept only where it does better than no host part
        xh, fh, k = _search(engine, targets, [np.concatenate([x, HOST_START])], cfg)
        evals += k
        x, fx = (xh, fh) if fh <= fx else (np.concatenate([x, np.zeros(len(HOST_PARAMS))]), fx)
    prof = profile_of(x, name)
    return RequestFit(prof, engine, x, fx, evals, time.perf_counter() - t0, grid)


def require_decode_input(traces: list[RequestTrace]) -> None:
    """The decode cost is fitted from each request's time between its first and last token,
    ``(finish_s - arrival_s - ttft_s) / (output_tokens - 1)`` (vLLM's TPOT: ITLs are not needed, a
    last-token time is enough). A trace set in which no request has a last-token time has nothing to fit
    it on: named here, in one line, before any replay."""
    if any("finish_s" in rt.requests for rt in traces):
        return
    raise BadInput(traces[0].source, None, "finish_s",
                   "missing column: the decode cost is fitted from each request's last-token time "
                   "((finish_s - first token) / (output_tokens - 1)); this trace has TTFTs only (no finish_s, "
                   "no ITLs)")


def initial_values(traces: list[RequestTrace]) -> dict:
    return dict(zip(PARAMS, map(float, initial_guess(traces))))


def calibrate_from_requests(paths: list, out, name: str | None, engine_opts: tuple[str, ...], search_engine: bool,
                            max_evals: int, echo: Callable[[str], None], virtual_engines: int = 1,
                            grid: dict | None = None, warm: tuple = (),
                            frontend: FrontEnd | None = None,
                            fit_window: tuple[float, float] | None = None, fit_host: bool = False,
                            fleet=None) -> RequestFit:
    """``calibrate --from-requests``: fit, attach the baseline parameters and
    the engine, write the profile. Bad input is refused before any work. ``fleet``: the replicas the logs came
    from (``harness.requestlevel.fleet.FleetSpec``); the loss sums over each trace's assignments."""
    from pathlib import Path

    from harness.requestlevel.engine_options import (
        engine_settings,
        parse_engine_options,
        refuse_unservable,
        request_engine,
        trace_engine,
    )
    from harness.requestlevel.reconstruct import baseline_params
    from harness.requestlevel.validate import format_assignments, validate_assignments
    from traces.store import open_trace

    options = {**(fleet.engine if fleet else {}), **parse_engine_options(engine_opts)}
    from traces.errors import BadOption

    unknown = [w for w in warm if str(w) not in {str(p) for p in paths}]
    if unknown:
        raise BadOption("--warm", f"{unknown[0]} is not one of the traces being calibrated on")
    warm_set = {str(w) for w in warm}
    opened = [open_trace(p) for p in paths]
    engine = request_engine(None, options, stated=trace_engine(opened))
    rts = [RequestTrace.of(t).warmed("warm" if str(p) in warm_set else "cold").windowed(fit_window)
           for p, t in zip(paths, opened)]
    from harness.requestlevel.fleet import FleetSpec

    # each trace under each assignment of its fleet (a log naming its instances: its own)
    groups = [rt.under(fleet or FleetSpec()) for rt in rts]
    require_decode_input(rts)
    refuse_unservable(engine, [r.requests["prompt_tokens"] for r in rts], [r.requests["output_tokens"] for r in rts],
                      options)
    out = Path(out)
    fit = fit_requests([r for g in groups for r in g], engine, name or out.stem,
                       RequestFitConfig(max_evals=max_evals, search_engine=search_engine or bool(grid),
                                        virtual_engines=virtual_engines, grid=grid or {},
                                        frontend=frontend or FrontEnd(), fit_host=fit_host))
    prof = fit.profile
    overhead = float(fit.values[4])
    # no wall time in the file (it is printed): same traces, options and seed, same bytes
    prof.fitted_on = {"traces": [str(p) for p in paths], "warm_prefix": sorted(warm_set), "requests": int(sum(len(r.requests) for r in rts)),
                      **({"fit_window": list(fit_window), "timed_requests": int(sum(r.timed() for r in rts))}
                         if fit_window is not None else {}),
                      "method": "request-level: twin in the loop (Nelder-Mead on TTFT quantiles, per-request "
                                "TTFT and TPOT log errors)",
                      "engine": engine_settings(fit.engine),
                      "request_fit": {"frontend_overhead_s": overhead, "loss": fit.loss, "evals": fit.evals,
                                      **({"host_fitted": list(HOST_PARAMS)} if fit_host else {}),
                                      "initial": initial_values(rts),
                                      "engine_searched": search_engine or bool(grid), "virtual_engines": virtual_engines,
                                      "frontend": (frontend or FrontEnd()).to_json()},
                      **({"fleet": fleet.to_json()} if fleet else {})}
    if fit.engine_search:
        prof.fitted_on["request_fit"]["engine_search"] = fit.engine_search
    prof.derived = baseline_params([g[0] for g in groups], prof, fit.engine, overhead, virtual_engines, frontend)
    if fit_window is not None:
        echo(f"fit window {fit_window[0]:g}:{fit_window[1]:g} of each trace's requests by arrival: "
             f"{prof.fitted_on['timed_requests']} requests' timings fitted on, every request's arrival and lengths "
             "replayed")
    echo(f"calibrating from requests: {prof.fitted_on['requests']} requests in {len(rts)} trace(s), "
         f"{fit.evals} twin replays in {fit.wall_s:.1f} s, loss {fit.loss:.4f}")
    echo("fitted: " + "  ".join(f"{k}={v:.4g}" for k, v in zip(param_names(fit.values), fit.values)))
    if fit_host:
        echo(f"host: step_gap_s={prof.step_gap_s:.4g}  host_share={prof.host_share:.4g}  (async scheduling "
             f"{'on: the host overlaps the device' if fit.engine.async_scheduling else 'off: host and device add up'})")
    echo(f"engine: policy {fit.engine.policy}, max_num_batched_tokens {fit.engine.max_num_batched_tokens}, "
         f"max_num_seqs {fit.engine.max_num_seqs}, block_size {fit.engine.block_size}, "
         f"num_kv_blocks {fit.engine.num_kv_blocks}, {virtual_engines} virtual engine(s)"
         + ("  (searched)" if search_engine or grid else ""))
    if frontend is not None and frontend.on:
        echo(f"front end: {1e3 * frontend.per_request_s:.2f} ms per admitted request ({frontend.source}), "
             f"{1e3 * frontend.per_output_s:.3f} ms per delivered token ({frontend.output_source}), "
             + (f"{100 * frontend.accept_share:.0f}% of a request's cost accepted before any waiting handling "
                f"({frontend.accept_source})" if frontend.accept_share > 0 else "one FIFO queue"))
    per_trace = {}
    for p, g in zip(paths, groups):
        v = validate_assignments(g, prof, fit.engine, overhead, fleet.seeds if fleet else 1, record_steps=False,
                                 virtual_engines=virtual_engines, frontend=frontend)
        per_trace[str(p)] = {**{k: v.median.metrics[k] for k in ("ttft", "tpot", "e2e")},
                             **({"assign_seeds": v.spread()} if fleet else {})}
        echo(f"fit on {p}:")
        for line in format_assignments(v):
            echo("  " + line)
    prof.metrics = {"train": per_trace}
    prof.save(out)
    echo(f"wrote {out}")
    return fit
