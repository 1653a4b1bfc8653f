"""Host drift: how fast a trace's host runs against a batch-time profile.

A profile is fitted on one host; its steps can run at another speed on
another host (the second host of ``vllm_cpu`` runs every step ~1.45x
slower). The *speed factor* of a trace against a profile is the median of
actual / typical step time over the trace's steps, divided by the same
median on the profile's own calibration steps (``speed_baseline``, stored by
``calibrate``; the noise model's median exp(log_mu) for older profiles). So
a trace from the profile's own host and workload mix has a factor near 1,
and 1.45 means "steps take 45% longer than the profile says".

Medians, not means: a step's time is lognormal jitter plus rare stalls of
several times the typical time, and a median ignores the stalls. The 95%
interval is the distribution-free one of a median (order statistics at
n/2 -+ 1.96 sqrt(n)/2). Factors are given for all steps and per step class
(prefill-heavy, decode-only, mixed), since a host's slowdown need not be
uniform: the second host's decode-only steps are 1.27-1.60x slower.

*Drift* is flagged when the trace's interval excludes the band the profile's
own noise model allows for a median of that many steps (99.7%: the sampling
spread of a lognormal median, sigma * sqrt(pi/2) / sqrt(n) in log terms,
widened by the baseline's own sampling spread). That is a strict test: with
thousands of steps it flags a 3% speed difference, which is the point: the
profile's promise is its noise model, and a gate (``check
--max-speed-drift``) decides how much drift a deployment tolerates.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from estimators.timemodel.profile import BatchTimeProfile
from estimators.timemodel.step_ratios import CLIP_LOG, typical_ratios
from traces.store import Trace

STEP_CLASSES = ("all", "prefill-heavy", "decode-only", "mixed")
Z_CI = 1.96  # the factor's own 95% interval
Z_BAND = 3.0  # the noise model's band: 99.7% of medians of n steps


def step_class(steps: pd.DataFrame) -> np.ndarray:
    """Per step: ``decode-only`` (no prefill token), ``prefill-heavy``
    (prefill tokens at least as many as decode tokens) or ``mixed`` (some
    prefill, mostly decodes)."""
    p = steps["prefill_tokens"].to_numpy(dtype=np.int64)
    d = steps["decode_tokens"].to_numpy(dtype=np.int64)
    return np.where(p == 0, "decode-only", np.where(p >= d, "prefill-heavy", "mixed"))


def class_masks(steps: pd.DataFrame) -> dict[str, np.ndarray]:
    cls = step_class(steps)
    return {name: (np.ones(len(steps), dtype=bool) if name == "all" else cls == name) for name in STEP_CLASSES}


def median_ci(x: np.ndarray, z: float = Z_CI) -> tuple[float, float, float]:
    """Median of ``x`` and its distribution-free interval (order statistics)."""
    s = np.sort(x)
    n = len(s)
    half = z * np.sqrt(n) / 2.0
    lo = int(max(0, np.floor(n / 2.0 - half)))
    hi = int(min(n - 1, np.ceil(n / 2.0 + half)))
    return float(np.median(s)), float(s[lo]), float(s[hi])


def speed_baseline(profile: BatchTimeProfile, steps: pd.DataFrame) -> dict[str, dict]:
    """Median actual/typical per class on the profile's own calibration steps:
    what a factor of 1 means. Stored in the profile by ``calibrate``."""
    ratio = typical_ratios(profile, steps)
    out = {}
    for name, m in class_masks(steps).items():
        r = ratio[m & np.isfinite(ratio)]
        if len(r):
            med = float(np.median(r))
            # the online factor averages clipped log ratios: its own zero point
            mean_log = float(np.mean(np.clip(np.log(r) - np.log(med), -CLIP_LOG, CLIP_LOG)) + np.log(med))
            out[name] = {"median_ratio": med, "mean_log_ratio": mean_log, "n": int(len(r))}
    return out


@dataclass
class ClassDrift:
    step_class: str
    n: int
    factor: float
    ci_low: float
    ci_high: float
    band_low: float
    band_high: float
    drift: bool


@dataclass
class DriftReport:
    profile: str
    classes: list[ClassDrift]

    @property
    def overall(self) -> ClassDrift:
        return self.classes[0]

    @property
    def drift(self) -> bool:
        return any(c.drift for c in self.classes)

    def to_json(self) -> dict:
        return {"profile": self.profile, "drift": self.drift,
                "speed_factor": self.overall.factor, "ci95": [self.overall.ci_low, self.overall.ci_high],
                "classes": {c.step_class: {k: v for k, v in asdict(c).items() if k != "step_class"}
                            for c in self.classes}}

    def lines(self) -> list[str]:
        out = [f"host speed factor against profile {self.profile} (median actual/typical step time, "
               f"1 = the profile's own host): " + ("DRIFT" if self.drift else "within the profile's noise")]
        for c in self.classes:
            flag = "  <- drift" if c.drift else ""
            out.append(f"  {c.step_class:<14} {c.n:>7,} steps  {c.factor:6.3f}  95% CI [{c.ci_low:.3f}, "
                       f"{c.ci_high:.3f}]  noise band [{c.band_low:.3f}, {c.band_high:.3f}]{flag}")
        return out


def _baseline(profile: BatchTimeProfile, name: str) -> tuple[float, int]:
    base = (profile.metrics.get("speed_baseline") or {}).get(name)
    if base:
        return float(base["median_ratio"]), int(base["n"])
    return float(np.exp(profile.noise.log_mu)), 0


def speed_drift(profile: BatchTimeProfile, steps: pd.DataFrame, min_steps: int = 20) -> DriftReport:
    """The speed factor of ``steps`` against ``profile``, overall and per
    step class (classes with fewer than ``min_steps`` steps are left out)."""
    ratio = typical_ratios(profile, steps)
    sigma = max(profile.noise.log_sigma, 1e-6)
    classes = []
    for name, m in class_masks(steps).items():
        r = ratio[m & np.isfinite(ratio)]
        if len(r) < min_steps:
            continue
        base, n_base = _baseline(profile, name)
        med, lo, hi = median_ci(r)
        # the log-median's sampling spread under the noise model, for this
        # trace's n and (when known) the baseline's own n
        se = sigma * np.sqrt(np.pi / 2.0) * np.sqrt(1.0 / len(r) + (1.0 / n_base if n_base else 0.0))
        band_lo, band_hi = float(np.exp(-Z_BAND * se)), float(np.exp(Z_BAND * se))
        f, flo, fhi = med / base, lo / base, hi / base
        classes.append(ClassDrift(name, int(len(r)), f, flo, fhi, band_lo, band_hi, bool(flo > band_hi or fhi < band_lo)))
    return DriftReport(profile.name, classes)


def trace_drift(trace: Trace, profiles: dict[str, BatchTimeProfile]) -> dict[str, DriftReport]:
    """The speed factor of each instance of a trace with steps against its
    profile; an instance with too few steps to tell (one that served next to
    nothing, e.g. an emulated replica no request reached) has no report."""
    if not trace.has("steps"):
        return {}
    steps = trace.read("steps")
    reports = {inst: speed_drift(prof, steps[steps["instance_id"].astype(str) == inst])
               for inst, prof in profiles.items()}
    return {inst: r for inst, r in reports.items() if r.classes}
