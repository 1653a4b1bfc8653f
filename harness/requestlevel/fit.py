"""``calibrate --from-requests``: a batch-time profile from request-level
traces (arrivals, lengths, measured TTFT and end times; no engine steps).

Fitted: the ``six`` form's step cost ``const + P*prefill_tokens +
D*decode_tokens + sum_ctx*cached_tokens`` (the two square terms stay 0:
ShareGPT-sized prompts do not reveal them) and the front end's overhead
added to every TTFT; optionally the engine's token budget and
``max_num_seqs``. Everything fitted travels in the profile
(``fitted_on.engine``, ``fitted_on.request_fit``).

How (the rule, with its reasons: ``docs/concepts/request-fit.md``):

1. *Starts* from the data (``initial_guess``): the decode terms from TPOTs (a
   request's mean inter-token time is the mean step time while it decodes;
   over the measured decode intervals we know how many requests decoded
   alongside and their context, so ``TPOT_i ~ const + D*n_i +
   sum_ctx*ctx_i`` is a small least-squares problem), the prefill cost and
   the front end from the lowest-load TTFTs (``TTFT_i ~ overhead +
   step(prompt_i)`` where little else runs); and points along the valley
   where ``const`` and ``D`` trade off (``candidate_starts``).
2. *Ranges* the request log supports (``fit_bounds``): every point the
   search proposes is evaluated inside them.
3. *The twin in the loop*: Nelder-Mead on the log of the five values, each
   evaluation replaying every trace's arrivals on the twin (noise off) and
   scoring TTFT quantiles (p10..p99), per-request TTFT and TPOT log errors
   (``score``). One search per start on the earlier part of each trace's
   timed requests; the candidate that best predicts the held-back later
   part is kept (``held_back_split``) and refined on all of them.
4. *Intervals* (``fit_uncertainty``): a bootstrap over requests.

With ``search_engine`` a grid (by default budget x max_num_seqs; ``--search
KEY=v1,v2`` for any engine setting, e.g. ``num_kv_blocks``) is scored at the
fitted values, the best kept, and the search repeated until it stalls
(``ENGINE_REFIT_FACTOR``).

The optimiser is our own (``simplex.py``).
"""
from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from estimators.engine.config import InstanceConfig
from estimators.timemodel.features import term_names
from estimators.timemodel.fit import NoiseModel
from estimators.timemodel.profile import BatchTimeProfile
from harness.requestlevel.fit_bounds import Bounds, in_flight_at_arrival
from harness.requestlevel.fleet import LEAST_REQUESTS
from harness.requestlevel.frontend import FrontEnd
from harness.requestlevel.replay import ReplicaPart, part_timings, replica_parts
from harness.requestlevel.replay_pool import ReplayPool, default_jobs
from harness.requestlevel.simplex import nelder_mead
from harness.requestlevel.validate import RequestTrace, replay_requests, tpot_of
from harness.requestlevel.weight_floor import kv_read_floor, weight_floor
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


# "loss": the fit's own loss on the held-back requests; "figures": the mean |log error| of the figures a run is
# judged by (TTFT mean, p50, p99, TPOT mean, E2E mean; ``summary_error``)
HELD_BACK_METRICS = ("loss", "figures")
LOW_LOAD_SHARE = 0.1  # the starts' prefill and front end come from the lowest-load tenth of the lightest trace
LOW_LOAD_MIN = 5
# the loss's terms (``score``): TTFT quantiles, per-request TTFT and TPOT, mean TPOT; and the means of TTFT and E2E,
# the figures a run is judged by (chosen on the GPU runs' fit windows: docs/results/gpu-fidelity.md)
LOSS_WEIGHTS = {"ttft_q": 1.0, "ttft_req": 1.0, "tpot_req": 0.5, "tpot_mean": 1.0, "ttft_mean": 1.0, "e2e_mean": 1.0}
WITHOUT_MEANS = {k: v for k, v in LOSS_WEIGHTS.items() if k not in ("ttft_mean", "e2e_mean")}
# the search under the engine the grid chose: a new fit (its start was fitted under another engine), with no
# candidates beside it, whose result is the profile; patience stops it, this many times --max-evals at most (at
# 1x the LMBench H100 fleet fit's was cut at 120 evaluations while still improving: loss 2.69, against 2.63
# where patience stopped it, after 201; docs/concepts/request-fit.md)
ENGINE_REFIT_FACTOR = 4
MEMO = 64  # points whose replays an evaluator keeps (the searches revisit only recent ones)
MIN_SPLIT = 10  # timed requests each side of a held-back split, at least
HELD_BACK = 1 / 3  # share of each trace's timed requests (the latest) held back to choose among candidates


@dataclass
class RequestFitConfig:
    max_evals: int = 120  # per search (a candidate's; the refinement and the polish take at most this many too, the
    # search after the engine grid ENGINE_REFIT_FACTOR times as many)
    patience: int | None = 30  # a search stops after this many evaluations without a 0.1% gain (None: never)
    held_back: float = HELD_BACK  # 0: no held-back choice (the lowest in-window loss is kept)
    held_back_metric: str = "loss"  # HELD_BACK_METRICS: how a candidate's prediction of the held-back part is scored
    refine_step: float = 0.1  # the chosen candidate refined on every timed request: simplex size (log units)
    refine_evals: int = 60  # 0: the chosen candidate kept as it is
    polish_evals: int = 20  # a fleet's refined values, polished on every assignment (see ``fit_requests``)
    bounds: bool = True  # hold the values to the ranges the requests support (``fit_bounds``)
    bootstrap: int = 100  # bootstrap draws of the requests for the values' intervals (0: none)
    seed: int = 0  # of the bootstrap draws
    search_engine: bool = False  # search ``grid`` (default: budget x max_num_seqs)
    grid: dict = field(default_factory=dict)  # engine field -> candidate values
    virtual_engines: int = 1  # V0 pipeline parallelism (see request_validate.replay_requests)
    fit_host: bool = False  # fit the host's part too (HOST_PARAMS)
    frontend: FrontEnd = field(default_factory=FrontEnd)  # serial front end (fixed, never fitted here)
    budgets: tuple[int, ...] = BUDGETS
    max_seqs: tuple[int, ...] = MAX_SEQS
    weights: dict = field(default_factory=lambda: dict(LOSS_WEIGHTS))
    jobs: int = 1  # worker processes for the replays (``replay_pool``); the results do not depend on it


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


def _decode_rows(traces: list[RequestTrace]) -> tuple[np.ndarray, np.ndarray] | None:
    """Stage 1's regression rows: per request with a TPOT, (1, requests decoding alongside, their
    context) against the TPOT (time-averaged over its decode interval); None without any."""
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
        return np.vstack(rows), np.concatenate(y)
    if unfinished is not None:
        raise BadInput(unfinished.source, None, "finish_s", "no request finishes after its first token "
                       "(finish_s missing or not after arrival_s + ttft_s): the decode cost cannot be fitted")
    return None


def initial_guess(traces: list[RequestTrace]) -> np.ndarray:
    """Stages 1 and 2: the five values from TPOTs and low-load TTFTs."""
    rows = _decode_rows(traces)
    if rows is not None:
        X, Y = rows
        coef = np.linalg.lstsq(X / Y[:, None], np.ones(len(Y)), rcond=None)[0]  # relative least squares
        med = float(np.median(Y))
        const = coef[0] if coef[0] > 0 else 0.8 * med
        d = coef[1] if coef[1] > 0 else 0.002 * med
        ctx = coef[2] if coef[2] > 0 else 1e-8
    else:
        const, d, ctx = 0.02, 1e-4, 1e-8
    # prefill: the lightest-loaded trace's lowest-load TTFTs against prompt length (a busy run's other TTFTs are
    # mostly queueing: through them the intercept came out above a second)
    lo = _lightest(traces)
    p = lo.requests["prompt_tokens"].to_numpy(dtype=np.float64)
    t = lo.requests["ttft_s"].to_numpy(dtype=np.float64)
    ok = low_load(lo)
    if not ok.any():
        raise BadInput(lo.source, None, "ttft_s", "no request has a measured TTFT (nothing to fit the prefill cost on)")
    A = np.column_stack([np.ones(ok.sum()), p[ok]])
    a, b = np.linalg.lstsq(A / t[ok][:, None], np.ones(ok.sum()), rcond=None)[0]
    t_low, p_low = float(np.median(t[ok])), float(np.median(p[ok]))
    # the front end at most half of a typical lowest-load TTFT: those requests queued behind each other's
    # prefill in a busy run's first wave, which the line through them takes for front end
    overhead = min(max(a - const, 1e-3), 0.5 * t_low)
    pre = b if b > 0 else max(0.5 * (t_low - overhead) / max(p_low, 1.0), 1e-6)
    return np.array([const, pre, d, ctx, overhead])


def _lightest(traces: list[RequestTrace]) -> RequestTrace:
    return min(traces, key=lambda t: len(t.requests) / max(np.ptp(t.requests["arrival_s"].to_numpy()), 1e-9))


def low_load(rt: RequestTrace) -> np.ndarray:
    """The timed requests that arrived at the lowest load: no more requests in flight than the
    ``LOW_LOAD_SHARE`` quantile of the trace's in-flight counts, and at least ``LOW_LOAD_MIN`` of them
    (the fewest in flight first) where the trace has that many."""
    r = rt.requests
    arr, ttft = r["arrival_s"].to_numpy(dtype=np.float64), r["ttft_s"].to_numpy(dtype=np.float64)
    end = r["finish_s"].to_numpy(dtype=np.float64) if "finish_s" in r else arr + ttft
    load = in_flight_at_arrival(arr, np.where(np.isfinite(ttft), end, np.nan))
    ok = np.isfinite(load) & np.isfinite(ttft)
    if not ok.any():
        return ok
    keep = ok & (load <= np.quantile(load[ok], LOW_LOAD_SHARE))
    if keep.sum() < LOW_LOAD_MIN:
        idx = np.flatnonzero(ok)
        keep[idx[np.argsort(load[idx], kind="stable")[:LOW_LOAD_MIN]]] = True
    return keep


def candidate_starts(traces: list[RequestTrace]) -> list[tuple[str, np.ndarray]]:
    """Start points of the candidates' searches, labelled: the data-driven guess; the same with the
    front end at a quarter of the lightest trace's median lowest-load TTFT (from a front end near 0 the log-space
    simplex can stall many steps away from tens of ms; with one prompt length, as in long shared
    inputs, the intercept says nothing); and two points along the valley where the step's constant
    and its per-decode cost trade off: the decode step at the mean load kept, its constant share
    halved and doubled (capped at 90%). Nelder-Mead is local: each start's search ends in its own
    part of the valley, and the held-back requests choose between them."""
    x0 = initial_guess(traces)
    lo = _lightest(traces)
    x1 = x0.copy()
    x1[4] = max(x0[4], 0.25 * float(np.median(lo.requests["ttft_s"].to_numpy(dtype=np.float64)[low_load(lo)])))
    out = [("data", x0)] + ([] if np.allclose(x0, x1) else [("front end", x1)])
    rows = _decode_rows(traces)
    n_mean = float(np.mean(rows[0][:, 1])) if rows is not None else 0.0
    if n_mean > 1:
        step = x0[0] + x0[2] * n_mean
        share = x0[0] / step
        for label, s in (("constant share halved", share / 2), ("constant share doubled", min(2 * share, 0.9))):
            x = x0.copy()
            x[0], x[2] = s * step, (1 - s) * step / n_mean
            out.append((label, x))
    return out


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
    e2e: np.ndarray | None = None  # measured end-to-end (finish_s - arrival_s); NaN without finish_s

    @classmethod
    def of(cls, rt: RequestTrace) -> TraceTargets:
        tt = rt.requests["ttft_s"].to_numpy(dtype=np.float64)
        return cls(rt, tt, rt.tpot(), np.nanpercentile(tt, TTFT_QUANTILES), _e2e(rt))

    def part(self, keep: np.ndarray) -> TraceTargets:
        """The same replay scored on the requests in ``keep`` only (the others' timings blanked)."""
        tt = np.where(keep, self.ttft, np.nan)
        return TraceTargets(self.rt, tt, np.where(keep, self.tpot, np.nan), np.nanpercentile(tt, TTFT_QUANTILES),
                            np.where(keep, self.e2e, np.nan))

    def timed(self) -> np.ndarray:
        return np.flatnonzero(np.isfinite(self.ttft))


def _e2e(rt: RequestTrace) -> np.ndarray:
    r = rt.requests
    if "finish_s" not in r:
        return np.full(len(r), np.nan)
    return r["finish_s"].to_numpy(dtype=np.float64) - r["arrival_s"].to_numpy(dtype=np.float64)


def _logerr(a: np.ndarray, b: np.ndarray) -> float:
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    return float(np.mean(np.abs(np.log(a[ok] / b[ok])))) if ok.any() else 10.0


def _mean_logerr(a: np.ndarray, b: np.ndarray) -> float:
    """|log| of the ratio of the means over the requests both have."""
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    return abs(float(np.log(a[ok].mean() / b[ok].mean()))) if ok.any() else 10.0


Prediction = tuple[np.ndarray, np.ndarray, np.ndarray]  # one trace's replayed TTFT, TPOT and E2E per request


def predict(values: np.ndarray, engine: InstanceConfig, targets: list[TraceTargets], virtual_engines: int = 1,
            frontend: FrontEnd | None = None, pool: ReplayPool | None = None) -> list[Prediction] | None:
    """Each trace replayed with the profile of ``values``: TTFT, TPOT and E2E per request (None: a
    request never got its first token). The traces' replicas replay as parts of their own
    (``replica_parts``), over ``pool``'s workers when one is given; the parts are put back in each
    trace's order, so the numbers do not depend on the workers."""
    overhead = float(values[4])
    tasks = [(i, part) for i, tg in enumerate(targets) for part in _parts(tg.rt, engine)]
    run = partial(_timings, profile=profile_of(values, "fit"), overhead_s=overhead, virtual_engines=virtual_engines,
                  frontend=frontend)
    done = (pool or ReplayPool()).map(run, [p for _, p in tasks])
    ttft = [np.full(len(tg.rt.requests), np.nan) for tg in targets]
    fin = [np.full(len(tg.rt.requests), np.nan) for tg in targets]
    for (i, part), (t, f) in zip(tasks, done):
        ttft[i][part.rows], fin[i][part.rows] = t, f + overhead
    out = []
    for tg, t, f in zip(targets, ttft, fin):
        if not np.isfinite(t).all():
            return None
        out.append((t, tpot_of(tg.rt.requests, t, f), f - tg.rt.requests["arrival_s"].to_numpy(np.float64)))
    return out


def _parts(rt: RequestTrace, engine: InstanceConfig) -> list[ReplicaPart]:
    """``rt``'s replay as independent parts: its replicas' (one engine: the whole trace); a fleet
    assigned by least requests, which decides on the twin, as one part."""
    if rt.fleet is not None and rt.fleet.assign == LEAST_REQUESTS and rt.fleet.replicas > 1:
        return [ReplicaPart(-1, np.arange(len(rt.requests)), rt, engine, 0)]
    return replica_parts(rt, engine)


def _timings(part: ReplicaPart, profile: BatchTimeProfile, overhead_s: float, virtual_engines: int,
             frontend: FrontEnd | None) -> tuple[np.ndarray, np.ndarray]:
    """A part's replayed TTFT and finish per request (its rows' order); run in a worker."""
    if part.replica >= 0:
        return part_timings(part, profile, overhead_s, virtual_engines, frontend)
    res = replay_requests(part.rt, profile, part.engine, overhead_s, virtual_engines=virtual_engines, frontend=frontend)
    return (res.requests["ttft_s"].to_numpy(dtype=np.float64), res.requests["finish_s"].to_numpy(dtype=np.float64))


def score(preds: list[Prediction] | None, targets: list[TraceTargets], w: dict,
          rows: list[np.ndarray] | None = None) -> float:
    """Sum over traces of the weighted log errors (``LOSS_TERMS``) over each trace's timed requests
    (``rows``: the requests to score, repeats allowed, e.g. a bootstrap's)."""
    if preds is None:
        return 1e3
    total = 0.0
    for k, ((ttft, tp, e2e), tg) in enumerate(zip(preds, targets)):
        idx = tg.timed() if rows is None else rows[k]
        m_ttft, m_tpot, q = tg.ttft[idx], tg.tpot[idx], tg.q if rows is None else \
            np.percentile(tg.ttft[idx], TTFT_QUANTILES)
        p_ttft, p_tpot = ttft[idx], np.where(np.isfinite(m_tpot), tp[idx], np.nan)
        total += w["ttft_q"] * _logerr(np.percentile(p_ttft, TTFT_QUANTILES), q)
        total += w["ttft_req"] * _logerr(p_ttft, m_ttft)
        if w.get("ttft_mean"):
            total += w["ttft_mean"] * _mean_logerr(p_ttft, m_ttft)
        if np.isfinite(m_tpot).any():
            total += w["tpot_req"] * _logerr(p_tpot, m_tpot)
            total += w["tpot_mean"] * abs(np.log(np.nanmean(p_tpot) / np.nanmean(m_tpot)))
        m_e2e = tg.e2e[idx]
        if (w.get("e2e_req") or w.get("e2e_mean")) and np.isfinite(m_e2e).any():
            total += w.get("e2e_req", 0.0) * _logerr(e2e[idx], m_e2e)
            total += w.get("e2e_mean", 0.0) * _mean_logerr(e2e[idx], m_e2e)
    return total


def summary_error(preds: list[Prediction] | None, targets: list[TraceTargets]) -> float:
    """The mean |log error| of the figures a run is judged by (TTFT mean, p50, p99; TPOT mean; E2E mean)
    over each trace's timed requests, averaged over traces: how a candidate predicts held-back time."""
    if preds is None:
        return 1e3
    errs = []
    for (ttft, tp, e2e), tg in zip(preds, targets):
        idx = tg.timed()
        m, p = tg.ttft[idx], ttft[idx]
        errs += [_mean_logerr(p, m)] + [abs(float(np.log(np.percentile(p, q) / np.percentile(m, q)))) for q in (50, 99)]
        if np.isfinite(tg.tpot[idx]).any():
            errs.append(_mean_logerr(tp[idx], tg.tpot[idx]))
        if np.isfinite(tg.e2e[idx]).any():
            errs.append(_mean_logerr(e2e[idx], tg.e2e[idx]))
    return float(np.mean(errs))


def loss(values: np.ndarray, engine: InstanceConfig, targets: list[TraceTargets], w: dict,
         virtual_engines: int = 1, frontend: FrontEnd | None = None) -> float:
    """Sum over traces of the TTFT-quantile, per-request TTFT/TPOT and mean-TPOT log errors."""
    return score(predict(values, engine, targets, virtual_engines, frontend), targets, w)


class Evaluator:
    """The replays of one fit, remembered by point (a point's predictions score any part of the
    requests: the fit part, the held-back part, a bootstrap's draw), with the ranges
    (``fit_bounds``) applied to every point the search proposes."""

    def __init__(self, engine: InstanceConfig, targets: list[TraceTargets], cfg: RequestFitConfig,
                 bounds: Bounds | None, pool: ReplayPool | None = None):
        self.engine, self.targets, self.cfg, self.bounds, self.pool = engine, targets, cfg, bounds, pool
        self.replays = 0  # evaluations: each replays every one of ``targets``
        self._memo: OrderedDict[bytes, list[Prediction] | None] = OrderedDict()

    def preds(self, values: np.ndarray) -> list[Prediction] | None:
        key = np.asarray(values, dtype=np.float64).tobytes() + repr(self.engine).encode()
        if key in self._memo:
            self._memo.move_to_end(key)
        else:
            self.replays += 1
            self._memo[key] = predict(values, self.engine, self.targets, self.cfg.virtual_engines, self.cfg.frontend,
                                      self.pool)
            if len(self._memo) > MEMO:
                self._memo.popitem(last=False)
        return self._memo[key]

    def point(self, z: np.ndarray) -> tuple[np.ndarray, float]:
        """The values searched at log-point ``z`` (projected into the ranges) and the penalty."""
        if self.bounds is None:
            return np.exp(z), 0.0
        x, pen = self.bounds.penalised(z[:len(PARAMS)])
        return np.concatenate([x, np.exp(z[len(PARAMS):])]), pen

    def objective(self, targets: list[TraceTargets]) -> Callable[[np.ndarray], float]:
        def f(z: np.ndarray) -> float:
            x, pen = self.point(z)
            return score(self.preds(x), targets, self.cfg.weights) + pen
        return f


@dataclass
class Candidate:
    start: str  # where its search started
    values: np.ndarray
    fit_loss: float  # on the earlier part of each trace's timed requests
    held_loss: float  # on the later part, held back from its search

    def to_json(self) -> dict:
        return {"start": self.start, "values": dict(zip(param_names(self.values), map(float, self.values))),
                "fit_loss": self.fit_loss, "held_back_loss": self.held_loss}


@dataclass
class RequestFit:
    profile: BatchTimeProfile
    engine: InstanceConfig
    values: np.ndarray
    loss: float
    evals: int
    wall_s: float
    engine_search: list[dict] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    chosen: int | None = None  # index into candidates (None: no held-back choice was made)
    selection_note: str = ""
    bounds: Bounds | None = None
    uncertainty: dict | None = None
    draws: np.ndarray | None = None  # the bootstrap's values, one row per draw (not stored in the profile)


def held_back_split(targets: list[TraceTargets], share: float) -> tuple[list[TraceTargets], list[TraceTargets]] | None:
    """Each trace's timed requests split by arrival: the earlier ``1 - share`` to fit on, the later
    ``share`` held back (None where a trace has too few timed requests to hold any back)."""
    early, late = [], []
    for tg in targets:
        idx = tg.timed()  # rows are in arrival order
        cut = int(round(len(idx) * (1 - share)))
        if cut < MIN_SPLIT or len(idx) - cut < MIN_SPLIT:
            return None
        keep = np.zeros(len(tg.ttft), dtype=bool)
        keep[idx[:cut]] = True
        early.append(tg.part(keep))
        late.append(tg.part(~keep & np.isfinite(tg.ttft)))
    return early, late


def _search(ev: Evaluator, targets: list[TraceTargets], x0: np.ndarray, step: float, max_evals: int,
            patience: int | None) -> tuple[np.ndarray, float]:
    z, fz, _ = nelder_mead(ev.objective(targets), np.log(x0), step=step, max_evals=max_evals, patience=patience)
    return ev.point(z)[0], fz


def _choose(ev: Evaluator, traces: list[RequestTrace], cfg: RequestFitConfig) -> tuple[np.ndarray, list, int | None, str]:
    """Candidates searched on the earlier part of each trace's timed requests, one per start; the one
    that predicts the held-back later part best is kept (see the module docstring)."""
    labelled = candidate_starts(traces)
    if ev.bounds is not None:
        labelled = [(k, ev.bounds.project(x)) for k, x in labelled]
    split = held_back_split(ev.targets, cfg.held_back) if cfg.held_back > 0 else None
    if split is None:
        fits = [(_search(ev, ev.targets, x, 0.5, cfg.max_evals, cfg.patience), k) for k, x in labelled]
        (x, _), _ = min(fits, key=lambda p: p[0][1])
        why = ("no held-back choice: " + ("turned off" if cfg.held_back <= 0 else
               f"a trace has fewer than {2 * MIN_SPLIT} timed requests") + "; the lowest in-window loss kept")
        return x, [], None, why
    early, late = split
    cands = []
    for k, x0 in labelled:
        x, f = _search(ev, early, x0, 0.5, cfg.max_evals, cfg.patience)
        held = score(ev.preds(x), late, cfg.weights) if cfg.held_back_metric == "loss" else \
            summary_error(ev.preds(x), late)
        cands.append(Candidate(k, x, float(f), float(held)))
    best = min(range(len(cands)), key=lambda i: cands[i].held_loss)
    why = (f"{len(cands)} candidates fitted on the earlier {100 * (1 - cfg.held_back):.0f}% of each trace's timed "
           f"requests; kept the one that predicts the later {100 * cfg.held_back:.0f}% best, then refined on all")
    return cands[best].values, cands, best, why


def fit_requests(traces: list[RequestTrace], engine: InstanceConfig, name: str,
                 cfg: RequestFitConfig | None = None, bounds: Bounds | None = None) -> RequestFit:
    """The search (see the module docstring). ``bounds``: the ranges the values are held to (None: none)."""
    cfg = cfg or RequestFitConfig()
    with ReplayPool(cfg.jobs) as pool:
        return _fit(traces, engine, name, cfg, bounds, pool)


def _fit(traces: list[RequestTrace], engine: InstanceConfig, name: str, cfg: RequestFitConfig,
         bounds: Bounds | None, pool: ReplayPool) -> RequestFit:
    t0 = time.perf_counter()
    targets = [TraceTargets.of(rt) for rt in traces]
    ev = Evaluator(engine, targets, cfg, bounds if cfg.bounds else None, pool)
    # a trace replayed under several assignments of a fleet (``RequestTrace.under``: one per seed, the same source)
    # has its candidates searched on its first assignment only; the refinement sums over every assignment
    first = sorted({tg.rt.source: i for i, tg in reversed(list(enumerate(targets)))}.values())
    coarse = ev if len(first) == len(targets) else Evaluator(engine, [targets[i] for i in first], cfg, ev.bounds, pool)
    x, cands, chosen, why = _choose(coarse, [traces[i] for i in first], cfg)
    if cfg.refine_evals > 0:
        x, fx = _search(coarse, coarse.targets, x, cfg.refine_step, min(cfg.refine_evals, cfg.max_evals), cfg.patience)
        if coarse is not ev:  # then a short polish on every assignment
            x, fx = _search(ev, targets, x, cfg.refine_step / 2, min(cfg.polish_evals, cfg.max_evals),
                            None if cfg.patience is None else max(cfg.patience // 2, 1))
    else:  # the chosen candidate as it is
        fx = ev.objective(targets)(np.log(x))
    grid: list[dict] = []
    if cfg.search_engine:
        space = cfg.grid or {"max_num_batched_tokens": cfg.budgets, "max_num_seqs": cfg.max_seqs}
        base = engine
        for combo in itertools.product(*space.values()):
            point = dict(zip(space, combo))
            try:
                e = replace(base, **point)
                e.to_array()  # refuses what vLLM refuses (e.g. budget < max_num_seqs)
            except ValueError:
                continue
            ev.engine = e
            grid.append({**point, "loss": score(ev.preds(x), targets, cfg.weights)})
        best = min(grid, key=lambda g: g["loss"])
        engine = ev.engine = coarse.engine = replace(base, **{k: best[k] for k in space})
        x, fx = _search(ev, targets, x, 0.5, ENGINE_REFIT_FACTOR * cfg.max_evals, cfg.patience)
    if cfg.fit_host:
        # from the fit without a host part: seven values searched from scratch strayed (on the PRO 6000 run
        # into a 4.8-s front end at 15 times the loss); kept only where it does better than no host part
        xh, fh = _search(ev, targets, np.concatenate([x, HOST_START]), 0.5, cfg.max_evals, cfg.patience)
        x, fx = (xh, fh) if fh <= fx else (np.concatenate([x, np.zeros(len(HOST_PARAMS))]), fx)
    unc, draws = None, None
    if cfg.bootstrap > 0:
        from harness.requestlevel.fit_uncertainty import uncertainty, with_candidates

        # a fleet's: on its first assignments, as its candidates were (the replays of every assignment cost as
        # many times more; the draws resample requests, not assignments)
        xb = x if np.all(x > 0) else x[:len(PARAMS)]  # a host part tried and not kept (zeros): the five alone
        unc, draws = uncertainty(coarse, xb, cfg, param_names(xb), TTFT_QUANTILES)
        unc = with_candidates(unc, PARAMS, [c.values for c in cands], [c.held_loss for c in cands])
    prof = profile_of(x, name)
    replays = ev.replays + (coarse.replays if coarse is not ev else 0)
    return RequestFit(prof, engine, x, float(fx), replays, time.perf_counter() - t0, grid, cands, chosen, why,
                      ev.bounds, unc, draws)


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


def fit_bounds(rts: list[RequestTrace], opened: list) -> Bounds:
    """The ranges of ``fit_bounds`` for these traces (``opened``: their ``Trace``s, whose meta names
    the model and GPU): the weight-read floor is the lowest of the traces' floors, and applied only
    where every trace has one; likewise the KV-read floor of the context term."""
    def lowest(floors):
        missing = [f for f in floors if f.seconds is None]
        return missing[0] if missing else min(floors, key=lambda f: f.seconds)

    return Bounds.of(rts, lowest([weight_floor(t.meta) for t in opened]),
                     lowest([kv_read_floor(t.meta) for t in opened]))


def initial_values(traces: list[RequestTrace]) -> dict:
    return dict(zip(PARAMS, map(float, initial_guess(traces))))


def calibrate_from_requests(paths: list, out, name: str | None, engine_opts: tuple[str, ...], search_engine: bool,
                            max_evals: int, echo: Callable[[str], None], virtual_engines: int = 1,
                            grid: dict | None = None, warm: tuple = (),
                            frontend: FrontEnd | None = None,
                            fit_window: tuple[float, float] | None = None, fit_host: bool = False,
                            fleet=None, fit_overrides: dict | None = None, jobs: int | None = None) -> RequestFit:
    """``calibrate --from-requests``: fit, attach the baseline parameters and
    the engine, write the profile. Bad input is refused before any work. ``fleet``: the replicas the logs came
    from (``harness.requestlevel.fleet.FleetSpec``); the loss sums over each trace's assignments.
    ``fit_overrides``: ``RequestFitConfig`` fields replaced (studies compare variants of the search); ``jobs``: the
    replays' worker processes (None: ``replay_pool.default_jobs``)."""
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
    stated = trace_engine(opened)
    engine = request_engine(None, options, stated=stated)
    from harness.twin.pools.memory import refuse_engine_memory

    refuse_engine_memory(engine, fleet.replicas if fleet else 1)
    rts = [RequestTrace.of(t).warmed("warm" if str(p) in warm_set else "cold").windowed(fit_window)
           for p, t in zip(paths, opened)]
    from harness.requestlevel.fleet import FleetSpec

    # each trace under each assignment of its fleet (a log naming its instances: its own)
    groups = [rt.under(fleet or FleetSpec()) for rt in rts]
    require_decode_input(rts)
    refuse_unservable(engine, [r.requests["prompt_tokens"] for r in rts], [r.requests["output_tokens"] for r in rts],
                      options, stated=stated)
    out = Path(out)
    bounds = fit_bounds(rts, opened)
    cfg = RequestFitConfig(max_evals=max_evals, search_engine=search_engine or bool(grid),
                           virtual_engines=virtual_engines, grid=grid or {}, frontend=frontend or FrontEnd(),
                           fit_host=fit_host, jobs=jobs or default_jobs())
    fit = fit_requests([r for g in groups for r in g], engine, name or out.stem,
                       replace(cfg, **(fit_overrides or {})), bounds)
    prof = fit.profile
    overhead = float(fit.values[4])
    # no wall time in the file (it is printed): same traces, options and seed, same bytes
    prof.fitted_on = {"traces": [str(p) for p in paths], "warm_prefix": sorted(warm_set), "requests": int(sum(len(r.requests) for r in rts)),
                      **({"fit_window": list(fit_window), "timed_requests": int(sum(r.timed() for r in rts))}
                         if fit_window is not None else {}),
                      "method": "request-level: twin in the loop (Nelder-Mead on TTFT quantiles, per-request "
                                "TTFT and TPOT log errors), within the ranges the requests support, the candidate "
                                "that best predicts held-back later requests kept (docs/concepts/request-fit.md)",
                      "engine": engine_settings(fit.engine),
                      "request_fit": {"frontend_overhead_s": overhead, "loss": fit.loss, "evals": fit.evals,
                                      **({"host_fitted": list(HOST_PARAMS)} if fit_host else {}),
                                      "initial": initial_values(rts),
                                      "engine_searched": search_engine or bool(grid), "virtual_engines": virtual_engines,
                                      "frontend": (frontend or FrontEnd()).to_json(),
                                      "bounds": {**bounds.to_json(), "applied": fit.bounds is not None},
                                      "selection": {"note": fit.selection_note, "chosen": fit.chosen,
                                                    "candidates": [c.to_json() for c in fit.candidates]},
                                      **({"uncertainty": fit.uncertainty} if fit.uncertainty else {})},
                      **({"fleet": fleet.to_json()} if fleet else {})}
    if fit.engine_search:
        prof.fitted_on["request_fit"]["engine_search"] = fit.engine_search
    prof.derived = baseline_params([g[0] for g in groups], prof, fit.engine, overhead, virtual_engines, frontend)
    if fit_window is not None:
        echo(f"fit window {fit_window[0]:g}:{fit_window[1]:g} of each trace's requests by arrival: "
             f"{prof.fitted_on['timed_requests']} requests' timings fitted on, every request's arrival and lengths "
             "replayed")
    echo(f"calibrating from requests: {prof.fitted_on['requests']} requests in {len(rts)} trace(s), "
         f"{fit.evals} evaluations (each a twin replay of every trace) in {fit.wall_s:.1f} s, loss {fit.loss:.4f}")
    echo("ranges the requests support:")
    for line in bounds.describe():
        echo("  " + line)
    echo(f"choice: {fit.selection_note}")
    for i, c in enumerate(fit.candidates):
        echo(f"  {'*' if i == fit.chosen else ' '} {c.start:<24} fit loss {c.fit_loss:.4f}  held-back loss "
             f"{c.held_loss:.4f}  " + "  ".join(f"{k}={v:.4g}" for k, v in zip(param_names(c.values), c.values)))
    echo("fitted: " + "  ".join(f"{k}={v:.4g}" for k, v in zip(param_names(fit.values), fit.values)))
    if fit.uncertainty:
        from harness.requestlevel.fit_uncertainty import format_uncertainty

        for line in format_uncertainty(fit.uncertainty):
            echo(line)
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
