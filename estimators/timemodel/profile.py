"""Batch-time profiles: the fitted model of one instance's step time, as a
versioned JSON document.

Schema (``profile_version`` 1)::

    {
      "profile_version": 1,
      "name": "qwen3-8b-h100",
      "form": "six" | "eq9",
      "coefficients": {TERM: {"value": float, "unit": str, "doc": str}, ...},
      "expected": {"multiplier", "p_stall", "stall_excess_mean", "rule"},
      "noise": {"kind": "lognormal+stalls", "log_mu", "log_sigma", "p_stall",
                "stall_excess_mean", "stall_excess_quantiles": {q: v}, ...},
      "step_gap_s": float,   # median engine time between consecutive steps
      "intake": {"per_request_s", "per_prompt_token_s", "boundaries", "rule"},
      "trajectory_noise": {"steps": [n...], "common_log_var": [v...], "mean_ratio", "rule"},
      "fitted_on": {"traces": [...], "instance", "rows", "split_seed",
                    "holdout", "loss", "stall_pct"},
      "metrics": {"holdout": {...}, "train": {...}, "evaluate_on": {...}},
      "derived": {"theta_pre_tokens_per_s", "mean_decode_step_s",
                  "lps": {"k", "mean_service_s", "scv"}}
    }

Limits (refused at load, naming the key): coefficients within +-1e9 s per
unit; ``noise.log_mu``/``log_sigma`` within +-50; stall excesses in
[0, 1e9]; ``step_gap_s`` in [0, 10); intake costs at most 10 s; ``derived``
and ``metrics.speed_baseline`` numbers finite and bounded; integers too
large for a float refused, not overflowed.

The *typical* time of a step is the linear model; the *expected* time is
typical * (1 + p_stall * mean stall excess) with the stalls taken, as in
the paper, as the residuals above the stall percentile (the
``expected`` section). The ``noise`` section is the simulation model of the
jitter and its tail (its own, detector-based stall rate).
Sums of many steps (TTFT estimates) use the expected time because stalls
add up; single-step accuracy (MAPE) is scored on the typical time because
the median-like prediction is what minimises absolute percentage error.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from estimators.timemodel.features import FORMS, design_matrix, term_names
from estimators.timemodel.fit import NoiseModel, StallAllowance
from estimators.timemodel.intake import Intake
from estimators.timemodel.step_correlation import TrajectoryNoise
from traces.datamodel.limits import shown
from traces.errors import BadInput
from traces.files.jsonio import MAX_BYTES, parse_json
from traces.files.outputs import write_output_json
from traces.files.paths import read_text

PROFILE_VERSION = 1

# The terms a step-time model needs non-negative. A step's time is
# the fixed cost plus what each item adds, and an item can never make a step
# faster: the fixed cost and the first-order cost of every computed token
# (prefill and decode) are >= 0. In ``eq9`` every term is such a cost
# (tokens, context read by decodes, prefill attention), so all four are.
# ``six``'s context and square terms are a second-order expansion: on the
# CPU recordings sum(p^2) comes out negative in 4 of 12 (a prefill token
# costs less in a larger chunk: GEMM efficiency) and sum(c) negative with
# sum(c^2) positive in 3 (a curve in the context), each a better held-out
# fit than eq9, so they are left free; what calibration requires of them is
# that the fitted model predicts a positive time for every recorded step, and
# the estimators floor any time at 0 beyond the fitted range.
NONNEGATIVE_TERMS: dict[str, tuple[str, ...]] = {
    "eq9": ("const", "tokens", "decode_ctx", "prefill_attn"),
    "six": ("const", "P", "D"),
}


def negative_coefficient(form: str, coefficients: np.ndarray) -> tuple[str, float] | None:
    """The first term of ``form`` that must be >= 0 and is not, with its value."""
    for term, value in zip(FORMS[form], coefficients):
        if term.name in NONNEGATIVE_TERMS[form] and not value >= 0:
            return term.name, float(value)
    return None


@dataclass
class BatchTimeProfile:
    name: str
    form: str
    coefficients: np.ndarray
    noise: NoiseModel = field(default_factory=NoiseModel)
    fitted_on: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, Any] = field(default_factory=dict)
    step_gap_s: float = 0.0  # engine time between steps (output handling, request intake)
    allowance: StallAllowance = field(default_factory=StallAllowance)
    intake: Intake = field(default_factory=Intake)  # request intake at the joining boundary (estimators.timemodel.intake)
    # what sums of steps need beyond the per-step noise (estimators.timemodel.step_correlation)
    trajectory: TrajectoryNoise = field(default_factory=TrajectoryNoise)
    # async scheduling only: the share of a step's time that is the host's (input preparation before the
    # launch), overlapped with the device's previous step; 0 = all device (docs/concepts/batch-time.md)
    host_share: float = 0.0

    @property
    def expected_multiplier(self) -> float:
        return self.allowance.multiplier

    def typical(self, steps: pd.DataFrame) -> np.ndarray:
        return design_matrix(steps, self.form) @ self.coefficients

    def expected(self, steps: pd.DataFrame) -> np.ndarray:
        return self.typical(steps) * self.expected_multiplier

    def to_json(self) -> dict[str, Any]:
        return {
            "profile_version": PROFILE_VERSION,
            "name": self.name,
            "form": self.form,
            "coefficients": {t.name: {"value": float(v), "unit": t.unit, "doc": t.doc}
                             for t, v in zip(FORMS[self.form], self.coefficients)},
            "expected": {"multiplier": self.expected_multiplier, "p_stall": self.allowance.p_stall,
                         "stall_excess_mean": self.allowance.excess_mean,
                         "rule": "expected step time = typical * (1 + p_stall * stall_excess_mean), the stalls "
                                 "being the residuals above the stall percentile"},
            "noise": self.noise.to_json(),
            "step_gap_s": self.step_gap_s,
            **({"host_share": self.host_share} if self.host_share else {}),  # absent = 0: older files unchanged
            "intake": self.intake.to_json(),
            "trajectory_noise": self.trajectory.to_json(),
            "fitted_on": self.fitted_on,
            "metrics": self.metrics,
            "derived": self.derived,
        }

    def save(self, path: str | Path, force: bool = True) -> None:
        """Write the profile JSON with latroute's marker key (so a later
        ``--force`` may replace it); an existing file is replaced only with
        ``force`` and only if it carries the marker (``traces.files.outputs``)."""
        write_output_json(Path(path), self.to_json(), "profile", force=force)

    @classmethod
    def from_json(cls, d: Any, source: str = "<profile>") -> BatchTimeProfile:
        if not isinstance(d, dict):
            raise BadInput(source, None, "profile", "not a JSON object")
        if d.get("profile_version") != PROFILE_VERSION:
            raise BadInput(source, None, "profile_version",
                           f"{d.get('profile_version')!r} is not supported (expected {PROFILE_VERSION})")
        form = d.get("form")
        if not isinstance(form, str) or form not in FORMS:
            raise BadInput(source, None, "form", f"unknown model form {form!r} (choose from {', '.join(FORMS)})")
        coefs = d.get("coefficients")
        if not isinstance(coefs, dict):
            raise BadInput(source, None, "coefficients", "missing or not an object")
        values = []
        for term in term_names(form):
            entry = coefs.get(term)
            value = entry.get("value") if isinstance(entry, dict) else entry
            values.append(_number(source, f"coefficients.{term}", value, -MAX_COEF, MAX_COEF))
        bad = negative_coefficient(form, np.array(values))
        if bad is not None:
            doc = next(t.doc for t in FORMS[form] if t.name == bad[0])
            raise BadInput(source, None, f"coefficients.{bad[0]}",
                           f"{bad[1]:.6g} is negative: the model needs it >= 0 ({doc})")
        nm = _section(d, "noise", NoiseModel.from_json, source)
        finite = [nm.log_mu, nm.log_sigma, nm.p_stall, nm.stall_excess_mean, *nm.stall_excess_quantiles.values()]
        if not all(np.isfinite(finite)):
            raise BadInput(source, None, "noise", "every value must be a finite number")
        if nm.log_sigma < 0 or not 0 <= nm.p_stall <= 1:
            raise BadInput(source, None, "noise", "log_sigma must be >= 0 and p_stall in [0, 1]")
        allowance = _section(d, "expected", lambda e: StallAllowance(float(e.get("p_stall", 0.0)),
                                                                    float(e.get("stall_excess_mean", 0.0))), source)
        if not 0 <= allowance.p_stall <= 1 or not 0 <= allowance.excess_mean < float("inf"):
            raise BadInput(source, None, "expected", "p_stall must be in [0, 1] and stall_excess_mean >= 0")
        gap = d.get("step_gap_s", 0.0)
        if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not 0 <= gap < 10:
            raise BadInput(source, None, "step_gap_s", f"must be a number of seconds >= 0, got {gap!r}")
        share = d.get("host_share", 0.0)
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share < 1:
            raise BadInput(source, None, "host_share", f"must be a share in [0, 1), got {share!r}")
        if not allowance.multiplier <= MAX_COEF:
            raise BadInput(source, None, "expected.stall_excess_mean", f"p_stall * stall_excess_mean above {MAX_COEF:g}")
        if not -MAX_LOG <= nm.log_mu <= MAX_LOG or nm.log_sigma > MAX_LOG or not 0 <= nm.stall_excess_mean <= MAX_COEF:
            raise BadInput(source, None, "noise", f"log_mu and log_sigma must be within +-{MAX_LOG:g} and "
                           f"stall_excess_mean in [0, {MAX_COEF:g}]")
        for q, v in nm.stall_excess_quantiles.items():
            try:
                level = float(q)
            except ValueError:
                level = -1.0
            if not 0 <= level <= 100 or not 0 <= v <= MAX_COEF:
                raise BadInput(source, None, f"noise.stall_excess_quantiles.{q}",
                               f"needs a quantile level in [0, 100] and an excess in [0, {MAX_COEF:g}], got {shown(v)}")
        intake = _section(d, "intake", Intake.from_json, source)
        if intake.per_request_s > 10 or intake.per_prompt_token_s > 10 or not 0 <= intake.boundaries <= 2**53:
            raise BadInput(source, None, "intake", "per-request and per-token costs must be at most 10 s and "
                           "boundaries a count in [0, 2^53]")
        name = d.get("name", Path(source).stem)
        if not isinstance(name, str):
            raise BadInput(source, None, "name", f"must be a string, got {type(name).__name__}")
        sections = {}
        for key in ("fitted_on", "metrics", "derived"):
            sec = d.get(key)
            if sec is not None and not isinstance(sec, dict):
                raise BadInput(source, None, key, "not an object")
            sections[key] = sec or {}
        _check_derived(source, sections["derived"])
        _check_speed_baseline(source, sections["metrics"])
        return cls(name=name, form=form, coefficients=np.array(values), noise=nm,
                   fitted_on=sections["fitted_on"], metrics=sections["metrics"], derived=sections["derived"],
                   step_gap_s=float(gap), allowance=allowance, intake=intake, host_share=float(share),
                   trajectory=_section(d, "trajectory_noise", TrajectoryNoise.from_json, source))


def _section(d: dict, key: str, parse: Callable[[dict], Any], source: str) -> Any:
    """``parse`` of the profile's object ``key`` ({} when absent), its
    refusals reported against that key."""
    sec = d.get(key) or {}
    if not isinstance(sec, dict):
        raise BadInput(source, None, key, "not an object")
    try:
        return parse(sec)
    except (TypeError, ValueError, OverflowError, AttributeError) as e:
        raise BadInput(source, None, key, str(e)) from None


MAX_COEF = 1e9  # seconds per unit of any term (traces.datamodel.limits.MAX_TIME_S): no step time overflows a float
MAX_LOG = 50.0  # log-scale noise parameters: exp() of them stays finite


def _number(source: str, key: str, value: Any, lo: float, hi: float, integer: bool = False) -> float:
    """``value`` as a float, refused unless a JSON number (not a boolean, not
    an integer too large for a float) within [lo, hi]; ``integer``: whole."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
        raise BadInput(source, None, key, f"missing or not a {'whole ' if integer else ''}number: {shown(value)}")
    try:
        v = float(value)
    except OverflowError:
        raise BadInput(source, None, key, f"an integer of {len(str(abs(value)))} digits is out of range") from None
    if not lo <= v <= hi:
        raise BadInput(source, None, key, f"{shown(value)} outside [{lo:g}, {hi:g}]")
    return v


def _check_derived(source: str, derived: dict) -> None:
    """The baseline estimators' parameters, where present: finite numbers of
    a bounded size (they reach ``estimators.baselines.estimators`` as they are, which
    floor a negative time at 0: a negative rate is a bad model, not a
    corrupt file) and a whole batch size."""
    for key, lo, hi in (("theta_pre_tokens_per_s", -1e12, 1e12), ("mean_decode_step_s", -MAX_COEF, MAX_COEF)):
        if derived.get(key) is not None:
            _number(source, f"derived.{key}", derived[key], lo, hi)
    for sec, keys in (("lps", (("k", 1, 2**31 - 1, True), ("mean_service_s", -MAX_COEF, MAX_COEF, False),
                                ("scv", -1e12, 1e12, False), ("arrival_rate", -1e12, 1e12, False))),
                      ("queue", (("b0", -MAX_COEF, MAX_COEF, False), ("b1", -MAX_COEF, MAX_COEF, False)))):
        part = derived.get(sec)
        if part is None:
            continue
        if not isinstance(part, dict):
            raise BadInput(source, None, f"derived.{sec}", "not an object")
        for key, lo, hi, whole in keys:
            if part.get(key) is not None:
                _number(source, f"derived.{sec}.{key}", part[key], lo, hi, whole)


def _check_speed_baseline(source: str, metrics: dict) -> None:
    """``metrics.speed_baseline``: what a speed factor of 1 means (read by
    ``estimators.timemodel.online_speed`` and ``drift``, and handed to the twin's
    kernel as a log ratio): positive finite ratios, whole counts."""
    base = metrics.get("speed_baseline")
    if base is None:
        return
    if not isinstance(base, dict):
        raise BadInput(source, None, "metrics.speed_baseline", "not an object")
    for name, entry in base.items():
        key = f"metrics.speed_baseline.{name}"
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise BadInput(source, None, key, "not an object")
        if "median_ratio" in entry or "mean_log_ratio" not in entry:
            _number(source, f"{key}.median_ratio", entry.get("median_ratio"), 1e-9, 1e9)
        if "mean_log_ratio" in entry:
            _number(source, f"{key}.mean_log_ratio", entry["mean_log_ratio"], -MAX_LOG, MAX_LOG)
        if "n" in entry:
            _number(source, f"{key}.n", entry["n"], 0, 2**53, integer=True)


def load_profile(name_or_path: str | Path) -> BatchTimeProfile:
    """A built-in profile by name, or a profile JSON file by path."""
    from estimators.timemodel.builtin_profiles import BUILTIN_PROFILES

    key = str(name_or_path)
    if key in BUILTIN_PROFILES:
        return BatchTimeProfile.from_json(BUILTIN_PROFILES[key], f"built-in profile {key}")
    path = Path(key)
    if not os.path.lexists(path):
        raise BadInput(path, None, "profile",
                       f"no such file and not a built-in profile (built-in: {', '.join(BUILTIN_PROFILES)})")
    return BatchTimeProfile.from_json(read_json_input(path, "profile"), str(path))


def read_json_input(path: Path, what: str) -> Any:
    """A user's JSON file (``--profile``, ``--pool``) through the one input
    gate (``traces.files.paths``: no FIFOs, devices, sockets or directories; UTF-8,
    a BOM stripped), parsed strictly (``traces.files.jsonio``: no NaN, no
    oversized integers, bounded nesting)."""
    return parse_json(read_text(path, what, max_bytes=MAX_BYTES), path, what)
