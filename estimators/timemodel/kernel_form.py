"""A fitted batch-time profile as the engine's kernels take it: the
``TimeModel`` of ``estimators.engine.timing`` (form id, coefficients, noise
vector, stall quantiles), built here so the engine imports no profile.
"""
from __future__ import annotations

import math

import numpy as np

from estimators.engine.layout import KernelInputError
from estimators.engine.timing import FORM_EQ9, FORM_SIX, TimeModel
from estimators.timemodel.profile import BatchTimeProfile

FORM_IDS = {"eq9": FORM_EQ9, "six": FORM_SIX}  # every form of features.FORMS (tests/project/test_import_layers.py checks)


def profile_arrays(p: BatchTimeProfile) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(form id, coefficients, noise vector, stall quantile levels, values)."""
    qs = sorted((float(k), float(v)) for k, v in p.noise.stall_excess_quantiles.items())
    return (FORM_IDS[p.form], np.asarray(p.coefficients, dtype=np.float64),
            np.array([p.noise.log_mu, p.noise.log_sigma, p.noise.p_stall, p.noise.stall_excess_mean]),
            np.array([q for q, _ in qs], dtype=np.float64), np.array([v for _, v in qs], dtype=np.float64))


def time_model(p: BatchTimeProfile) -> TimeModel:
    """The profile as the kernels take it."""
    form, coef, noise, qs, vs = profile_arrays(p)
    mult, gap = float(p.expected_multiplier), float(p.step_gap_s)
    if not (np.all(np.isfinite(coef)) and np.all(np.isfinite(noise)) and np.all(np.isfinite(vs))
            and math.isfinite(mult) and mult > 0 and math.isfinite(gap) and gap >= 0):
        # the kernels add these up step after step: a NaN or inf would loop or be silently everywhere
        raise KernelInputError(f"profile {p.name!r}: its coefficients, noise, multiplier and gap must be finite "
                               "(multiplier > 0, gap >= 0)")
    return TimeModel(form, coef, mult, gap, noise, qs, vs)
