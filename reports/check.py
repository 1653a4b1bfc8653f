"""``latroute check``: the regression gate.

A result directory's headline metrics are flattened to names such as
``estimators.sfs.mape`` or ``routers.sfs-hard.auc_ontime_utility`` and
compared with a baseline file (written by ``--write-baseline``). Error
metrics (MAPE, APE quantiles, TTFT) regress when they grow; utilities,
attainment, AUC and decision agreement regress when they shrink.

Default tolerances (relative change allowed before it counts as a
regression; override per metric with ``--tolerance``): errors 5% (MAPE 18%
may become 18.9%), utilities/attainment/AUC 2%, decision agreement 0 (any
lost step fails). The absolute floor 1e-9 keeps zero baselines comparable.

A gate must stop what it cannot judge rather than call it "ok", so
everything it reads is checked before any comparison:
- metrics, baseline values and tolerances are finite numbers (a NaN
  compares false with everything, so it would pass every test);
- a baseline carries the ``kind`` of the result it was written from and
  only metric names that kind produces: a validate baseline cannot check an
  estimate result;
- ``--tolerance NAME=FRACTION`` names one metric exactly; a pattern applies
  to several only when written as a glob (``*.mape``), and a name or
  pattern that matches no metric is refused (a typo would otherwise leave
  the default in force without a word);
- a malformed result (missing keys, wrong types) is refused with the file
  and the key, never a traceback;
- a value must be one a metric can take: magnitude at most ``METRIC_MAX``
  (1e12; a 400-digit integer does not fit a float), errors (MAPE, APE
  quantiles, trajectory error, TTFT) >= 0, SLO attainment and decision
  agreement in [0, 1] -- a negative MAPE would pass every "did it grow" test;
- a sweep is judged only when it is complete: its ``INCOMPLETE`` marker
  absent and as many result rows as its specification has cells (an
  interrupted sweep has fewer routers or rates, and "fewer metrics" is not
  "no regression");
- ``--max-speed-drift`` applies only to results that record host speed
  factors (estimate and validate): on a replay or sweep, which measure none,
  it is refused (exit 2) rather than passed, since a gate that cannot look
  must not say "ok".
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from reports.results import RESULT_KINDS, Result
from traces.errors import BadInput, BadOption
from traces.files.jsonio import read_json
from traces.files.paths import input_file

BASELINE_VERSION = 1
DEFAULT_TOLERANCES = {"error": 0.05, "utility": 0.02, "decision_agreement.rate": 0.0}
HIGHER_IS_BETTER = ("ontime_utility", "auc_ontime_utility", "auc_slo_attainment", "slo_attainment", "mean_utility",
                    "decision_agreement.rate")
GLOB_CHARS = "*?["
METRIC_MAX = 1e12  # no metric the gate reads comes near it: larger is a corrupted file, not a measurement
NON_NEGATIVE_METRICS = ("mape", "_ape", "trajectory_error", "ttft_p90_s")
FRACTION_METRICS = ("slo_attainment", "decision_agreement.rate")
DRIFT_KINDS = ("estimate", "validate")

# the metric names each kind of result flattens to (estimator, router and rate
# keys may themselves hold dots: plug-ins are module paths, rates are floats)
METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "estimate": (r"estimators\..+\.(mape|median_ape|p90_ape|p99_ape)", r"sfs_attribution\.trajectory_error"),
    "validate": (r"ttft\.(mape|median_ape|p90_ape)", r"decision_agreement\.rate"),
    "replay": (r"ontime_utility", r"slo_attainment", r"mean_utility", r"ttft_p90_s"),
    "sweep": (r"routers\..+\.auc_ontime_utility", r"routers\..+\.rate_.+\.(ontime_utility|slo_attainment)"),
}


def a_kind(kind: str) -> str:
    """The kind with its article: "an estimate", "a sweep"."""
    return ("an " if str(kind)[:1].lower() in "aeiou" else "a ") + str(kind)


def _type(v: Any) -> str:
    return "null" if v is None else {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(v), type(v).__name__)


class _Reader:
    """Typed access to a result's metrics.json: every failure names the file
    and the dotted key."""

    def __init__(self, file: Path):
        self.file = file

    def obj(self, v: Any, where: str) -> dict:
        if not isinstance(v, dict):
            raise BadInput(self.file, None, where, f"expected an object, got {_type(v)}")
        return v

    def num(self, v: Any, where: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadInput(self.file, None, where, f"expected a number, got {_type(v)}"
                           + (" (NaN when written): the gate cannot judge it" if v is None else ""))
        return finite_number(v, self.file, where)

    def opt(self, d: dict, key: str, where: str, out: dict[str, float], name: str) -> None:
        """``out[name] = d[key]`` when the key is present (absent: not measured)."""
        if key in d:
            out[name] = check_range(name, self.num(d[key], where), self.file, where)


def finite_number(v: int | float, file: Path | str, where: str) -> float:
    """``v`` as a float no larger than ``METRIC_MAX``, or BadInput naming it."""
    try:
        f = float(v)
    except OverflowError:
        raise BadInput(file, None, where, f"an integer of {len(str(abs(v)))} digits does not fit a float: "
                       "the gate cannot judge it") from None
    if not math.isfinite(f):
        raise BadInput(file, None, where, f"{v} is not a finite number: the gate cannot judge it")
    if abs(f) > METRIC_MAX:
        raise BadInput(file, None, where, f"{f:g} is beyond +-{METRIC_MAX:g}, not a value this metric takes")
    return f


def check_range(name: str, v: float, file: Path | str, where: str) -> float:
    """Refuse a value the metric ``name`` cannot take (a negative error, an
    attainment outside [0, 1]): it would judge as better than any real one."""
    if name.endswith(NON_NEGATIVE_METRICS) and v < 0:
        raise BadInput(file, None, where, f"{v:g} is negative: an error or latency is >= 0")
    if name.endswith(FRACTION_METRICS) and not 0.0 <= v <= 1.0:
        raise BadInput(file, None, where, f"{v:g} is not a fraction in [0, 1]")
    return v


def flatten(r: Result) -> dict[str, float]:
    """The gated metrics of ``r`` by name; BadInput on a malformed result."""
    rd = _Reader(r.path / "metrics.json")
    m, out = rd.obj(r.metrics, "metrics.json"), {}
    if r.kind == "estimate":
        for name, s in rd.obj(m.get("estimators", {}), "estimators").items():
            s = rd.obj(s, f"estimators.{name}")
            for k in ("mape", "median_ape", "p90_ape", "p99_ape"):
                rd.opt(s, k, f"estimators.{name}.{k}", out, f"estimators.{name}.{k}")
        a = rd.obj(m.get("sfs_attribution") or {}, "sfs_attribution")
        rd.opt(a, "trajectory_error", "sfs_attribution.trajectory_error", out, "sfs_attribution.trajectory_error")
    elif r.kind == "validate":
        if "ttft" not in m:
            raise BadInput(rd.file, None, "ttft", "missing (a validate result has TTFT metrics)")
        ttft = rd.obj(m["ttft"], "ttft")
        for k in ("mape", "median_ape", "p90_ape"):
            rd.opt(ttft, k, f"ttft.{k}", out, f"ttft.{k}")
        da = rd.obj(m.get("decision_agreement", {}), "decision_agreement")
        rd.opt(da, "rate", "decision_agreement.rate", out, "decision_agreement.rate")
    elif r.kind == "replay":
        for k in ("ontime_utility", "slo_attainment", "mean_utility", "ttft_p90_s"):
            rd.opt(m, k, k, out, k)
    elif r.kind == "sweep":
        for key, v in rd.obj(m.get("routers", {}), "routers").items():
            v = rd.obj(v, f"routers.{key}")
            if "auc_ontime_utility" not in v:
                raise BadInput(rd.file, None, f"routers.{key}.auc_ontime_utility", "missing")
            rd.opt(v, "auc_ontime_utility", f"routers.{key}.auc_ontime_utility", out,
                   f"routers.{key}.auc_ontime_utility")
            for rate, b in rd.obj(v.get("by_rate", {}), f"routers.{key}.by_rate").items():
                where = f"routers.{key}.by_rate.{rate}"
                b = rd.obj(b, where)
                for k in ("ontime_utility", "slo_attainment"):
                    if k not in b:
                        raise BadInput(rd.file, None, f"{where}.{k}", "missing")
                    rd.opt(b, k, f"{where}.{k}", out, f"routers.{key}.rate_{rate}.{k}")
    return out


def intervals(r: Result) -> dict[str, tuple[float, float]]:
    """95% intervals over seeds of a sweep's AUCs (``sweep --seeds K``, K >= 2),
    under the names ``flatten`` gives the AUCs."""
    out = {}
    if r.kind == "sweep":
        rd = _Reader(r.path / "metrics.json")
        for key, v in rd.obj(r.metrics.get("routers", {}), "routers").items():
            where = f"routers.{key}.auc_ontime_utility_ci"
            ci = rd.obj(rd.obj(v, f"routers.{key}").get("auc_ontime_utility_ci") or {}, where).get("ci95")
            if ci:
                if not isinstance(ci, list) or len(ci) != 2:
                    raise BadInput(rd.file, None, f"{where}.ci95", f"expected [low, high], got {_type(ci)}")
                lo, hi = rd.num(ci[0], f"{where}.ci95"), rd.num(ci[1], f"{where}.ci95")
                if lo > hi:
                    raise BadInput(rd.file, None, f"{where}.ci95", f"low {lo} is above high {hi}")
                out[f"routers.{key}.auc_ontime_utility"] = (lo, hi)
    return out


def higher_is_better(name: str) -> bool:
    return name.endswith(HIGHER_IS_BETTER)


def is_glob(pattern: str) -> bool:
    return any(c in pattern for c in GLOB_CHARS)


def parse_tolerances(items: tuple[str, ...] | list[str], names: set[str]) -> dict[str, float]:
    """``--tolerance NAME=FRACTION`` items, checked against the metric
    ``names`` being compared: a finite fraction >= 0, each name given once,
    and each name (or glob) matching at least one metric."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise BadOption("--tolerance", f"expected METRIC=FRACTION, got {item!r}")
        try:
            value = float(text)
        except ValueError:
            raise BadOption("--tolerance", f"{name}: {text.strip()!r} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise BadOption("--tolerance", f"{name}: {text.strip()} is not a finite fraction >= 0")
        if name in out:
            raise BadOption("--tolerance", f"{name} is given twice")
        matched = [n for n in names if fnmatchcase(n, name)] if is_glob(name) else [n for n in names if n == name]
        if not matched:
            hint = "" if is_glob(name) else " (names match exactly; write a glob such as '*.mape' for several)"
            raise BadOption("--tolerance", f"{name} matches no metric of this check{hint}")
        out[name] = value
    return out


def tolerance_for(name: str, overrides: dict[str, float]) -> float:
    """An exact name first, then the longest glob that matches, then the
    default of the metric's family."""
    if name in overrides and not is_glob(name):
        return overrides[name]
    globs = sorted((p for p in overrides if is_glob(p) and fnmatchcase(name, p)), key=lambda p: (-len(p), p))
    if globs:
        return overrides[globs[0]]
    if name.endswith("decision_agreement.rate"):
        return DEFAULT_TOLERANCES["decision_agreement.rate"]
    return DEFAULT_TOLERANCES["utility"] if higher_is_better(name) else DEFAULT_TOLERANCES["error"]


@dataclass
class Row:
    metric: str
    old: float | None
    new: float | None
    change: float | None
    tolerance: float
    verdict: str  # ok | better | REGRESSED | missing | new


def compare(baseline: dict[str, float], current: dict[str, float], overrides: dict[str, float],
            current_ci: dict[str, tuple[float, float]] | None = None) -> list[Row]:
    """With ``current_ci`` (``check --interval``) a metric that has an
    interval regresses only when its whole interval is worse than the
    baseline beyond tolerance: one unlucky draw does not fail the gate."""
    rows = []
    for name in sorted(set(baseline) | set(current)):
        old, new = baseline.get(name), current.get(name)
        tol = tolerance_for(name, overrides)
        if old is None:
            rows.append(Row(name, None, new, None, tol, "new"))
            continue
        if new is None:
            rows.append(Row(name, old, None, None, tol, "missing"))
            continue
        for v in (old, new, tol):
            if not math.isfinite(v):  # callers validate; a NaN here would pass every comparison below
                raise ValueError(f"{name}: {v} is not finite")
        judged = new
        if current_ci and name in current_ci:
            lo, hi = current_ci[name]
            judged = hi if higher_is_better(name) else lo  # the interval's most favourable end
        change = (new - old) / abs(old) if abs(old) > 1e-9 else (new - old)
        judged_change = (judged - old) / abs(old) if abs(old) > 1e-9 else (judged - old)
        worse = -judged_change if higher_is_better(name) else judged_change
        verdict = "REGRESSED" if worse > tol + 1e-12 else ("better" if worse < 0 else "ok")
        rows.append(Row(name, old, new, change, tol, verdict))
    return rows


def _kind_of_name(name: str) -> set[str]:
    return {k for k, pats in METRIC_NAMES.items() if any(re.fullmatch(p, name) for p in pats)}


def load_baseline(path: Path) -> dict:
    """A baseline file, checked: version, a known ``kind``, finite metrics
    whose names that kind produces."""
    path = Path(path)
    if not path.exists():
        raise BadInput(path, None, "baseline", "does not exist (create it with --write-baseline)")
    if not path.is_file():
        raise BadInput(path, None, "baseline", "not a regular file")
    doc = read_json(path, "baseline")
    if not isinstance(doc, dict) or type(doc.get("baseline_version")) is not int \
            or doc.get("baseline_version") != BASELINE_VERSION:
        raise BadInput(path, None, "baseline_version", f"not a latroute baseline (expected version {BASELINE_VERSION})")
    metrics = doc.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise BadInput(path, None, "metrics", "missing or empty")
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadInput(path, None, f"metrics.{k}", f"not a number: {_type(v)}")
        metrics[k] = check_range(k, finite_number(v, path, f"metrics.{k}"), path, f"metrics.{k}")
    kind = doc.get("kind")
    if kind not in RESULT_KINDS:
        raise BadInput(path, None, "kind", f"{kind!r} is not a result kind ({', '.join(RESULT_KINDS)}); "
                       "rewrite the baseline with --write-baseline")
    for k in metrics:
        if kind not in _kind_of_name(k):
            raise BadInput(path, None, f"metrics.{k}", f"not a metric of {a_kind(kind)} result")
    return doc


def check_kind(baseline: dict, r: Result, baseline_path: Path) -> None:
    """A baseline compares only with a result of its own kind."""
    kind = baseline.get("kind")
    if kind != r.kind:
        raise BadInput(baseline_path, None, "kind", f"{a_kind(kind)} baseline cannot check "
                       f"{a_kind(r.kind)} result ({r.path})")


def baseline_doc(r: Result) -> dict:
    return {"baseline_version": BASELINE_VERSION, "kind": r.kind, "source": str(r.path), "metrics": flatten(r)}


def speed_drift_violations(r: Result, max_drift: float) -> list[str]:
    """Instances whose host speed factor (``estimators.timemodel.drift``, in estimate
    and validate results) is further than ``max_drift`` from 1, either way."""
    if not math.isfinite(max_drift) or max_drift < 0:
        raise BadOption("--max-speed-drift", f"{max_drift} is not a finite fraction >= 0")
    if r.kind not in DRIFT_KINDS:
        raise BadOption("--max-speed-drift", f"{a_kind(r.kind)} result ({r.path}) records no host speed factors "
                        "(only estimate and validate results do): the option cannot gate it")
    rd = _Reader(r.path / "metrics.json")
    if "drift" not in r.metrics:
        raise BadInput(rd.file, None, "drift", "missing: this result records no host speed factors, so "
                       "--max-speed-drift cannot gate it")
    out = []
    for inst, d in rd.obj(r.metrics.get("drift") or {}, "drift").items():
        d = rd.obj(d, f"drift.{inst}")
        if d.get("speed_factor") is None:
            continue
        f = rd.num(d["speed_factor"], f"drift.{inst}.speed_factor")
        ci = d.get("ci95", [f, f])
        if not isinstance(ci, list) or len(ci) != 2:
            raise BadInput(rd.file, None, f"drift.{inst}.ci95", f"expected [low, high], got {_type(ci)}")
        lo, hi = rd.num(ci[0], f"drift.{inst}.ci95"), rd.num(ci[1], f"drift.{inst}.ci95")
        if abs(f - 1.0) > max_drift:
            out.append(f"{inst}: speed factor {f:.3f} (95% CI {lo:.3f}-{hi:.3f}) is more than "
                       f"{100 * max_drift:g}% from its profile {d.get('profile')}")
    return out


SWEEP_INCOMPLETE = "INCOMPLETE"  # harness.sweep.store's marker (reports do not import harness)
SWEEP_SPEC = "sweep.json"


def check_complete(r: Result) -> None:
    """Refuse to judge a sweep that is not finished: its INCOMPLETE marker
    is there, or it holds fewer (or more) result rows than its
    specification (``sweep.json``) or its metrics (``cells``) have cells."""
    if r.kind != "sweep":
        return
    marker = r.path / SWEEP_INCOMPLETE
    if os.path.lexists(marker):
        raise BadInput(marker, None, "sweep", "the sweep is incomplete: finish it with latroute sweep --resume "
                       "before gating it")
    rows = len(r.tables["results"]) if "results" in r.tables else None
    cells = r.metrics.get("cells")
    if cells is not None:
        if isinstance(cells, bool) or not isinstance(cells, int) or cells < 1:
            raise BadInput(r.path / "metrics.json", None, "cells", f"expected a count of cells >= 1, got {cells!r}"
                           if not isinstance(cells, (dict, list)) else f"expected a count, got {_type(cells)}")
        if rows is not None and rows != cells:
            raise BadInput(r.path / "results.parquet", None, "rows", f"{rows} rows for a sweep of {cells} cells "
                           "(metrics.json): the sweep is incomplete or was edited")
    spec_path = r.path / SWEEP_SPEC
    if os.path.lexists(spec_path):
        doc = read_json(input_file(spec_path, "specification"), "specification")
        spec_cells = doc.get("cells") if isinstance(doc, dict) else None
        if not isinstance(spec_cells, list):
            raise BadInput(spec_path, None, "cells", "missing: not a sweep specification")
        for n, what in ((rows, "results.parquet rows"), (cells, "metrics.json cells")):
            if n is not None and n != len(spec_cells):
                raise BadInput(spec_path, None, "cells", f"{len(spec_cells)} cells but {n} {what}: "
                               "the sweep is incomplete (finish it with latroute sweep --resume)")
