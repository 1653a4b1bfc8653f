"""Quick recalibration of a profile to a new host (``calibrate --update``).

A host that runs every step s times slower needs only one number to be
found again: the scale s. That takes a few dozen steps (a median), while a
full refit of four or six coefficients needs steps of every shape (long
prefills, many decodes) and so many more of them. ``update_profile`` scales
when it has fewer than ``FULL_REFIT_MIN_STEPS`` steps and refits the whole
model (same form) beyond; ``learning_curve`` measures, on the new trace,
how many steps each way needs to come within one point of held-out MAPE of
a full refit on everything, holding out the trace's *last* 20% of steps (the
future, as a deployment would meet it).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from estimators.evaluate.accuracy import mape
from estimators.timemodel.calibrate import step_gap
from estimators.timemodel.drift import speed_baseline
from estimators.timemodel.features import design_matrix, step_durations
from estimators.timemodel.fit import fit_batch_model
from estimators.timemodel.profile import BatchTimeProfile
from estimators.timemodel.step_ratios import typical_ratios

FULL_REFIT_MIN_STEPS = 2000  # d1->d1c, d2->d1b, d1->d2: a refit matched the scale only from ~1,600 steps
CURVE_SIZES = (25, 50, 100, 200, 400, 800, 1600, 3200)


def _base_ratio(profile: BatchTimeProfile) -> float:
    base = (profile.metrics.get("speed_baseline") or {}).get("all")
    return float(base["median_ratio"]) if base else float(np.exp(profile.noise.log_mu))


def scale_profile(profile: BatchTimeProfile, steps: pd.DataFrame) -> tuple[BatchTimeProfile, float]:
    """The profile with every coefficient times the steps' speed factor
    (median actual/typical over the profile's own baseline); the gap between
    steps is measured again on ``steps``."""
    r = typical_ratios(profile, steps)
    r = r[np.isfinite(r)]
    if r.size == 0:
        raise ValueError("no step with a positive duration to scale the profile by")
    s = float(np.median(r)) / _base_ratio(profile)
    new = replace(profile, coefficients=profile.coefficients * s, step_gap_s=step_gap(steps),
                  metrics={**profile.metrics}, fitted_on={**profile.fitted_on})
    return new, s


def refit_profile(profile: BatchTimeProfile, steps: pd.DataFrame, stall_pct: float = 99.9) -> BatchTimeProfile:
    """The same form fitted afresh on ``steps`` (relative loss, as
    ``calibrate``), keeping the profile's baseline parameters."""
    X, y = design_matrix(steps, profile.form), step_durations(steps)
    fit = fit_batch_model(X, y, loss="relative", stall_pct=stall_pct)
    if not np.all(np.isfinite(fit.coef)):
        raise ValueError("the refit is ill-conditioned (too few distinct batch shapes)")
    new = replace(profile, coefficients=fit.coef, noise=fit.noise, allowance=fit.allowance,
                  step_gap_s=step_gap(steps), metrics={**profile.metrics}, fitted_on={**profile.fitted_on})
    new.metrics["speed_baseline"] = speed_baseline(new, steps)
    return new


@dataclass
class Update:
    profile: BatchTimeProfile
    method: str  # "scale" | "refit"
    steps: int
    scale: float | None


def update_profile(profile: BatchTimeProfile, steps: pd.DataFrame) -> Update:
    n = len(steps)
    if n >= FULL_REFIT_MIN_STEPS:
        try:
            return Update(refit_profile(profile, steps), "refit", n, None)
        except (ValueError, np.linalg.LinAlgError):
            pass  # too few shapes: the scale is still well defined
    new, s = scale_profile(profile, steps)
    return Update(new, "scale", n, s)


def _heldout_mape(profile: BatchTimeProfile, test: pd.DataFrame) -> float:
    return mape(profile.typical(test), step_durations(test))


def learning_curve(profile: BatchTimeProfile, steps: pd.DataFrame, holdout: float = 0.2,
                   sizes: tuple[int, ...] = CURVE_SIZES) -> dict:
    """Held-out MAPE (on the last ``holdout`` of the steps, in time) of the
    old profile, of scaling from the first n steps, of refitting from them,
    and of a full refit on all the training steps."""
    steps = steps.sort_values("start_s", kind="stable").reset_index(drop=True)
    cut = int(round(len(steps) * (1 - holdout)))
    train, test = steps.iloc[:cut], steps.iloc[cut:]
    full = _heldout_mape(refit_profile(profile, train), test)
    rows = []
    for n in [s for s in sizes if s < cut] + [cut]:
        head = train.iloc[:n]
        scaled = _heldout_mape(scale_profile(profile, head)[0], test)
        try:
            refit = _heldout_mape(refit_profile(profile, head), test)
        except (ValueError, np.linalg.LinAlgError):
            refit = float("nan")
        rows.append({"steps": int(n), "scale_mape": scaled, "refit_mape": refit})

    def within(key: str) -> int | None:
        """Fewest steps from which the MAPE stays within one point of the full refit."""
        ok = [r[key] <= full + 0.01 for r in rows]
        for i in range(len(rows)):
            if all(ok[i:]):
                return rows[i]["steps"]
        return None

    return {"holdout_steps": int(len(test)), "old_mape": _heldout_mape(profile, test), "full_refit_mape": full,
            "rows": rows, "scale_steps_within_1pt": within("scale_mape"),
            "refit_steps_within_1pt": within("refit_mape")}


def format_curve(c: dict) -> str:
    lines = [f"held-out: last {c['holdout_steps']:,} steps; old profile {100 * c['old_mape']:.2f}% MAPE, "
             f"full refit on the rest {100 * c['full_refit_mape']:.2f}%",
             f"{'first n steps':>13} {'scale':>8} {'refit':>8}"]
    for r in c["rows"]:
        lines.append(f"{r['steps']:>13,} {100 * r['scale_mape']:7.2f}% {100 * r['refit_mape']:7.2f}%")
    lines.append(f"within 1 point of the full refit: scale after {c['scale_steps_within_1pt'] or 'never'} steps, "
                 f"refit after {c['refit_steps_within_1pt'] or 'never'} steps")
    return "\n".join(lines)
