"""actual / typical step time, per step: what both the host-drift report
(``estimators.timemodel.drift``) and the online speed factor (``estimators.timemodel.online_speed``)
are made of, and the clip the online factor puts on its log.

Its own module so that drift (whose speed baseline is the online factor's
zero point) and the online factor read the same ratios without importing
each other.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from estimators.timemodel.features import step_durations
from estimators.timemodel.profile import BatchTimeProfile

CLIP_LOG = 1.0  # a step counts as at most e (2.7x) slower or faster than typical


def typical_ratios(profile: BatchTimeProfile, steps: pd.DataFrame) -> np.ndarray:
    """actual / typical per step (steps whose typical time is not positive dropped)."""
    typ = profile.typical(steps)
    act = step_durations(steps)
    ok = (typ > 0) & np.isfinite(act) & (act > 0)
    out = np.full(len(steps), np.nan)
    out[ok] = act[ok] / typ[ok]
    return out
