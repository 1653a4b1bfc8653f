"""Online speed correction: scale a profile by how fast the host has been
running lately, learned only from steps that have *completed* before the
query (their start and end are in the honest snapshot; the in-flight step's
end is not).

The factor is an exponentially weighted mean of log(actual / typical) over
completed steps, relative to the profile's own baseline (``estimators.timemodel.drift``),
with normalised weights (sum w_i r_i / sum w_i), so it is unbiased from the
first step on instead of creeping up from 1 as a plain EWMA does. Each
step's log ratio is clipped at +-``clip`` (in log units) so a stall of
several times the typical step moves the factor by no more than a slow step
does. The rule is stated once, ``speed_update``: ``running_factors`` applies it
to a trace's completed steps, the twin's loop (``harness.twin.loop.parts``) to
each step it completes.

One factor for all steps: per step class (prefill-heavy, decode-only,
mixed) it predicted the next step's time no better (0.0-0.3 points of
MAPE on d1c, d1b and d2 against other recordings' profiles).

Half-life: 100 completed steps. A step's log ratio has a spread of about
sigma = 0.25 on the vllm_cpu hosts (the profiles' noise), so the factor's
own noise is about sigma * sqrt(ln 2 / (2 * 100)) = 1.5%, well under the
drifts worth correcting (6-55% between runs and hosts here), while a change
of host speed is followed within a few hundred steps (a few seconds of a
busy engine). ``latroute estimate --online-speed on`` reports the MAPE at
other half-lives on request (``--speed-half-life``), so the choice can be
checked on any trace.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from numba import njit

from estimators.timemodel.profile import BatchTimeProfile
from estimators.timemodel.step_ratios import CLIP_LOG, typical_ratios

HALF_LIFE_STEPS = 100.0


@dataclass(frozen=True)
class OnlineSpeedConfig:
    half_life_steps: float = HALF_LIFE_STEPS
    clip_log: float = CLIP_LOG


def baseline_log_ratio(profile: BatchTimeProfile) -> float:
    """The mean clipped log(actual/typical) on the profile's own steps (what a
    factor of 1 means: the running factor averages the same quantity); the
    noise model's log_mu for profiles without a speed baseline."""
    base = (profile.metrics.get("speed_baseline") or {}).get("all")
    if not base:
        return float(profile.noise.log_mu)
    return float(base.get("mean_log_ratio", np.log(base["median_ratio"])))


def step_log_ratios(profile: BatchTimeProfile, steps: pd.DataFrame, cfg: OnlineSpeedConfig) -> np.ndarray:
    """Per step: clipped log(actual/typical) relative to the baseline (0 for
    steps without a usable ratio)."""
    r = np.log(typical_ratios(profile, steps)) - baseline_log_ratio(profile)
    return np.clip(np.nan_to_num(r, nan=0.0), -cfg.clip_log, cfg.clip_log)


@njit(cache=True, inline="always")
def speed_update(lam, num, den, log_ratio, clip):
    """One completed step into the factor's weighted sums: its log ratio
    (against the baseline) clipped at +-``clip``, then decayed by ``lam``;
    the factor is exp(num / den). The rule's one statement: ``running_factors``
    and the twin's loop (``harness.twin.loop.parts``) both call it."""
    r = min(max(log_ratio, -clip), clip)
    return lam * num + r, lam * den + 1.0


def running_factors(log_ratios: np.ndarray, cfg: OnlineSpeedConfig) -> np.ndarray:
    """``out[k]`` = the speed factor known once steps 0..k-1 have completed
    (``out[0]`` = 1: nothing learned yet). Length len(log_ratios) + 1."""
    lam = 0.5 ** (1.0 / cfg.half_life_steps)
    out = np.ones(len(log_ratios) + 1)
    num = den = 0.0
    for k, r in enumerate(log_ratios):
        num, den = speed_update(lam, num, den, float(r), cfg.clip_log)
        out[k + 1] = np.exp(num / den)
    return out


def steps_to_converge(factors: np.ndarray, true_factor: float, within: float = 0.05) -> int | None:
    """Completed steps after which the running factor stays within
    ``within`` (relative) of ``true_factor`` for good; None if it never does."""
    off = np.abs(factors / true_factor - 1.0) > within
    if off[-1]:
        return None
    bad = np.flatnonzero(off)
    return int(bad[-1] + 1) if bad.size else 0
