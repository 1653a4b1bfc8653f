"""Calibration of batch-time profiles from recorded (or simulated) steps:
pool the steps of one instance from several traces, split them 80/20 at
random by step (seeded), fit each model form on the 80, score it on the 20,
and build a profile with its noise model and baseline parameters.

A form is fitted only where the steps determine it, and kept only if the
fit means something (10 steps gave a negative decode cost and
then negative TTFTs; identical steps gave R^2 NaN without a word):
- at least ``MIN_SHAPES_PER_TERM`` distinct batch shapes (rows of the
  design matrix) per term in the training split, so that each coefficient
  rests on several batches and the noise percentiles on more than a handful
  of residuals;
- its terms independent on these steps: full rank, and a condition number
  of the column-scaled design matrix under ``MAX_CONDITION`` (the 12 CPU
  recordings give 23-196);
- the durations vary (a constant time has no relation to batch shape);
- after the fit, the terms ``estimators.timemodel.profile.NONNEGATIVE_TERMS`` names
  are >= 0, and the model predicts a positive time for every step.
A form that fails is left out of the comparison (``FormResults.rejected``
says why); when none is left, calibration is refused with the reasons.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from estimators.baselines.params import lps_params, pooled_lps, request_params, throughput_params
from estimators.evaluate.accuracy import error_summary
from estimators.timemodel.drift import speed_baseline
from estimators.timemodel.features import design_matrix, step_durations
from estimators.timemodel.fit import BatchFit, fit_batch_model, scale_columns
from estimators.timemodel.intake import fit_intake, join_columns
from estimators.timemodel.online_speed import OnlineSpeedConfig, step_log_ratios
from estimators.timemodel.profile import BatchTimeProfile, negative_coefficient
from estimators.timemodel.step_correlation import TrajectoryNoise, fit_common_var, ordered_groups
from traces.errors import BadInput
from traces.store import open_trace


@dataclass(frozen=True)
class CalibrationConfig:
    forms: tuple[str, ...] = ("eq9", "six")
    holdout: float = 0.2
    stall_pct: float = 99.9
    seed: int = 0
    loss: str = "relative"
    instance: str | None = None


MIN_SHAPES_PER_TERM = 5
MAX_CONDITION = 1e6
SAME_TIME = 1e-9  # relative spread of durations under which every step took the same time


@dataclass
class FormResult:
    form: str
    fit: BatchFit
    train: dict
    holdout: dict


@dataclass
class StepData:
    steps: pd.DataFrame
    sources: list[dict] = field(default_factory=list)
    lps: dict | None = None
    requests: dict = field(default_factory=dict)  # queue-baseline fit and arrival rate


def step_window(n: int, window: tuple[float, float]) -> tuple[int, int]:
    """Indices [lo, hi) of the steps from fraction ``window[0]`` to
    ``window[1]`` of ``n`` steps in step order: the one rule by which
    ``calibrate --steps-window`` fits and ``estimate --score-window`` scores,
    so 0:0.3 and 0.3:1 split the same steps."""
    lo, hi = (int(np.floor(f * n)) for f in window)
    return lo, hi


def window_steps(steps: pd.DataFrame, window: tuple[float, float] | None) -> pd.DataFrame:
    """The steps from fraction ``window[0]`` to ``window[1]`` of their number,
    in step order (all of them without a window)."""
    if window is None:
        return steps
    steps = steps.sort_values("step", kind="stable")
    lo, hi = step_window(len(steps), window)
    return steps.iloc[lo:hi]


def load_steps(paths: list[str | Path], instance: str | None = None,
               window: tuple[float, float] | None = None) -> StepData:
    """Steps of one instance pooled over traces (with a ``trace`` column);
    with ``window`` (``step_window``), only that share of each trace's
    steps, and the requests and items of that time."""
    frames, sources, lps_parts, opened, spans = [], [], [], [], []
    for path in paths:
        trace = open_trace(path)
        if not trace.has("steps"):
            raise BadInput(trace.file("steps"), None, "steps", "trace has no steps table (nothing to calibrate on)")
        steps = trace.read("steps")
        ids = sorted(steps["instance_id"].unique())
        if instance is None and len(ids) > 1:
            raise BadInput(trace.file("steps"), None, "instance_id",
                           f"several instances ({', '.join(ids)}): choose one with --instance")
        chosen = instance if instance is not None else (ids[0] if ids else None)
        steps = steps[steps["instance_id"] == chosen]
        if steps.empty:
            raise BadInput(trace.file("steps"), None, "instance_id",
                           f"no steps of instance {chosen!r} (instances: {', '.join(ids) or 'none'})")
        steps = window_steps(steps, window)
        if steps.empty:
            raise BadInput(trace.file("steps"), None, "steps", f"no steps in the window {window[0]:g}:{window[1]:g}")
        span = (float(steps["start_s"].min()), float(steps["end_s"].max())) if window is not None else None
        steps = steps.assign(trace=str(path))
        opened.append(trace)
        spans.append(span)
        frames.append(steps)
        sources.append({"trace": str(path), "instance": chosen, "steps": int(len(steps)),
                        **({"window": list(window)} if window is not None else {})})
    # the step times themselves first: a degenerate log is refused for what it is before the
    # requests are walked along its steps (which a log with made-up times contradicts)
    check_step_times(pd.concat(frames, ignore_index=True))
    for k, trace in enumerate(opened):
        steps, chosen = frames[k], sources[k]["instance"]
        if trace.has("step_items") and trace.has("requests"):
            items = trace.read("step_items")
            items = items[(items["instance_id"] == chosen) & items["step"].isin(steps["step"])]
            reqs = trace.read("requests")
            if "instance_id" in reqs:
                reqs = reqs[reqs["instance_id"] == chosen]
            frames[k] = join_columns(steps, reqs)  # request intake at step boundaries (estimators.timemodel.intake)
            if spans[k] is not None:
                reqs = reqs[reqs["arrival_s"].between(*spans[k])]
            lps_parts.append(lps_params(steps, items, reqs))
    return StepData(pd.concat(frames, ignore_index=True), sources, pooled_lps(lps_parts),
                    request_params(opened, sources[0]["instance"], spans))


def check_step_times(steps: pd.DataFrame) -> np.ndarray:
    """The steps' durations, refused unless each is a positive finite number
    (row: the step's row within its trace's selected steps) and they vary
    (a constant time has no relation to batch shape)."""
    source = steps["trace"].iloc[0] if "trace" in steps and len(steps) else "steps"
    y = step_durations(steps)
    bad = np.flatnonzero(~(y > 0) | ~np.isfinite(y))
    if bad.size:
        raise BadInput(steps["trace"].iloc[bad[0]] if "trace" in steps else "steps", int(bad[0]) + 1, "end_s",
                       "step duration is not a positive finite number")
    if len(y) and np.ptp(y) <= SAME_TIME * np.max(y):  # (end - start) of equal steps differs in the last bits
        raise BadInput(source, None, "steps", f"every step took the same time ({y[0]:.6g} s): there is no relation "
                       "between batch and time to fit")
    return y


def holdout_mask(n: int, fraction: float, seed: int) -> np.ndarray:
    """True for the held-out rows: a seeded random ``fraction`` of steps."""
    if not 0 < fraction < 1:
        raise ValueError("holdout fraction must be in (0, 1)")
    rng = np.random.default_rng(seed)
    mask = np.zeros(n, dtype=bool)
    mask[rng.permutation(n)[: max(1, int(round(n * fraction)))]] = True
    return mask


def _score(X: np.ndarray, y: np.ndarray, fit: BatchFit) -> dict:
    typical = X @ fit.coef
    out = error_summary(typical, y)
    out["mape_expected"] = float(np.mean(np.abs(typical * fit.allowance.multiplier - y) / y))
    return out


class FormResults(dict):
    """The admissible forms' results by name; ``rejected`` maps each form
    left out to the reason."""

    def __init__(self) -> None:
        super().__init__()
        self.rejected: dict[str, str] = {}


def underdetermined(X: np.ndarray, form: str) -> str | None:
    """Why the steps of ``X`` cannot determine ``form``'s coefficients, or None."""
    n_terms = X.shape[1]
    shapes = len(np.unique(X, axis=0))
    need = MIN_SHAPES_PER_TERM * n_terms
    if shapes < need:
        return (f"{shapes} distinct batch shapes in the training split, its {n_terms} terms need at least {need} "
                f"({MIN_SHAPES_PER_TERM} per term)")
    scaled, _ = scale_columns(X)
    rank = int(np.linalg.matrix_rank(scaled))
    if rank < n_terms:
        return f"its terms are collinear on these steps (rank {rank} of {n_terms})"
    cond = float(np.linalg.cond(scaled))
    if not cond <= MAX_CONDITION:
        return f"ill-conditioned on these steps (condition number {cond:.3g} > {MAX_CONDITION:g})"
    return None


def inadmissible(form: str, X: np.ndarray, fit: BatchFit) -> str | None:
    """Why a fitted form is no model of step time, or None."""
    bad = negative_coefficient(form, fit.coef)
    if bad is not None:
        return f"coefficient {bad[0]} = {bad[1]:.3g} is negative (the model needs it >= 0)"
    typical = X @ fit.coef
    n_bad = int(np.sum(~(typical > 0)))
    if n_bad:
        return f"it predicts a time <= 0 for {n_bad} of the {len(typical)} steps"
    return None


def fit_forms(steps: pd.DataFrame, cfg: CalibrationConfig) -> FormResults:
    source = steps["trace"].iloc[0] if "trace" in steps and len(steps) else "steps"
    y = check_step_times(steps)
    test = holdout_mask(len(y), cfg.holdout, cfg.seed)
    results = FormResults()
    for form in cfg.forms:
        X = design_matrix(steps, form)
        problem = underdetermined(X[~test], form)
        if problem is None:
            fit = fit_batch_model(X[~test], y[~test], loss=cfg.loss, stall_pct=cfg.stall_pct)
            problem = inadmissible(form, X, fit)
        if problem is not None:
            results.rejected[form] = problem
            continue
        train = _score(X[~test], y[~test], fit)
        train["stall_rate"] = fit.noise.p_stall
        results[form] = FormResult(form, fit, train, _score(X[test], y[test], fit))
    if not results:
        reasons = "; ".join(f"{form}: {why}" for form, why in results.rejected.items())
        raise BadInput(source, None, "steps", f"cannot calibrate on these {len(y)} steps ({reasons})")
    return results


def best_form(results: dict[str, FormResult]) -> str:
    return min(results, key=lambda f: results[f].holdout["mape"])


def step_gap(steps: pd.DataFrame) -> float:
    """Median time from the end of a step to the start of the next (same
    trace and instance): output handling and request intake, part of every
    TTFT. Idle periods are rare enough not to move the median."""
    gaps = []
    keys = [k for k in ("trace", "instance_id") if k in steps]
    for _, g in steps.sort_values([*keys, "step"]).groupby(keys, sort=False):
        gaps.append(g["start_s"].to_numpy()[1:] - g["end_s"].to_numpy()[:-1])
    allg = np.concatenate(gaps) if gaps else np.zeros(0)
    allg = allg[allg >= 0]
    return float(np.median(allg)) if allg.size else 0.0


def build_profile(name: str, result: FormResult, data: StepData, cfg: CalibrationConfig) -> BatchTimeProfile:
    derived = throughput_params(data.steps)
    if data.lps:
        derived["lps"] = dict(data.lps)
        if "arrival_rate" in data.requests:
            derived["lps"]["arrival_rate"] = data.requests["arrival_rate"]
    if "queue" in data.requests:
        derived["queue"] = data.requests["queue"]
    profile = BatchTimeProfile(
        name=name,
        form=result.form,
        coefficients=result.fit.coef,
        noise=result.fit.noise,
        fitted_on={"traces": data.sources, "instance": data.sources[0]["instance"] if data.sources else None,
                   "rows": int(len(data.steps)), "train_rows": result.train["n"], "holdout": cfg.holdout,
                   "split_seed": cfg.seed, "loss": cfg.loss, "stall_pct": cfg.stall_pct,
                   "forms_compared": list(cfg.forms)},
        metrics={"holdout": result.holdout, "train": result.train},
        derived=derived,
        step_gap_s=step_gap(data.steps),
        allowance=result.fit.allowance,
        intake=fit_intake(data.steps),
    )
    # what a speed factor of 1 means for this profile (estimators.timemodel.drift)
    profile.metrics["speed_baseline"] = speed_baseline(profile, data.steps)
    typ, act = profile.typical(data.steps), step_durations(data.steps)
    ok = (typ > 0) & np.isfinite(act)
    profile.trajectory = TrajectoryNoise(
        fit_common_var([step_log_ratios(profile, g, OnlineSpeedConfig()) for g in ordered_groups(data.steps)]),
        float(act[ok].sum() / typ[ok].sum()) if ok.any() else 0.0)
    return profile


NOISE_CHECK_QUANTILES = (10, 50, 90)


def noise_check(profile: BatchTimeProfile, steps: pd.DataFrame, seed: int = 0) -> dict:
    """Do residuals simulated from the profile's noise model look like the
    recorded ones? Compares quantiles of actual/typical on ``steps`` with
    the same quantiles of 200k draws from the noise model."""
    ratio = step_durations(steps) / profile.typical(steps)
    ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
    sim = profile.noise.sample_ratio(np.random.default_rng(seed), 200_000)
    rec_q = np.percentile(ratio, NOISE_CHECK_QUANTILES)
    sim_q = np.percentile(sim, NOISE_CHECK_QUANTILES)
    return {f"p{q}": {"recorded": float(r), "simulated": float(m), "rel_diff": float(m / r - 1)}
            for q, r, m in zip(NOISE_CHECK_QUANTILES, rec_q, sim_q)}


def calibrate_instance(trace_dir: str | Path, instance: str, seed: int = 0, name: str | None = None) -> BatchTimeProfile:
    """A profile for one instance of one trace, both forms compared (the
    defaults of ``latroute calibrate``)."""
    cfg = CalibrationConfig(seed=seed, instance=instance)
    data = load_steps([trace_dir], instance)
    results = fit_forms(data.steps, cfg)
    return build_profile(name or f"{Path(trace_dir).name}-{instance}", results[best_form(results)], data, cfg)


def evaluate_profile(profile: BatchTimeProfile, steps: pd.DataFrame) -> dict:
    """The profile's accuracy on every step of another trace."""
    y = step_durations(steps)
    typical = profile.typical(steps)
    out = error_summary(typical, y)
    out["mape_expected"] = float(np.mean(np.abs(typical * profile.expected_multiplier - y) / y))
    return out

