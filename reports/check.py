"""``latroute check``: the regression gate.

A result directory's headline metrics are flattened to names such as
``estimators.sfs.mape`` or ``routers.sfs-hard.auc_ontime_utility`` and
compared with a baseline file (written by ``--write-baseline``). Error
metrics (MAPE, APE quantiles, TTFT) regress when they grow; utilities,
attainment, AUC and decision agreement regress when they shrink.

Default tolerances (relative change allowed before it counts as a
regression; override per metric name or suffix with ``--tolerance``):
errors 5% (MAPE 18% may become 18.9%), utilities/attainment/AUC 2%,
decision agreement 0 (any lost step fails). The absolute floor 1e-9 keeps
zero baselines comparable.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from reports.results import Result
from traces.errors import BadInput

BASELINE_VERSION = 1
DEFAULT_TOLERANCES = {"error": 0.05, "utility": 0.02, "decision_agreement.rate": 0.0}
HIGHER_IS_BETTER = ("ontime_utility", "auc_ontime_utility", "auc_slo_attainment", "slo_attainment", "mean_utility",
                    "decision_agreement.rate")


def flatten(r: Result) -> dict[str, float]:
    m, out = r.metrics, {}
    if r.kind == "estimate":
        for name, s in m.get("estimators", {}).items():
            for k in ("mape", "median_ape", "p90_ape", "p99_ape"):
                if s.get(k) is not None:
                    out[f"estimators.{name}.{k}"] = float(s[k])
        a = m.get("sfs_attribution") or {}
        if "trajectory_error" in a:
            out["sfs_attribution.trajectory_error"] = float(a["trajectory_error"])
    elif r.kind == "validate":
        for k in ("mape", "median_ape", "p90_ape"):
            if m["ttft"].get(k) is not None:
                out[f"ttft.{k}"] = float(m["ttft"][k])
        if m.get("decision_agreement", {}).get("rate") is not None:
            out["decision_agreement.rate"] = float(m["decision_agreement"]["rate"])
    elif r.kind == "replay":
        for k in ("ontime_utility", "slo_attainment", "mean_utility", "ttft_p90_s"):
            if m.get(k) is not None:
                out[k] = float(m[k])
    elif r.kind == "sweep":
        for key, v in m.get("routers", {}).items():
            out[f"routers.{key}.auc_ontime_utility"] = float(v["auc_ontime_utility"])
            for rate, b in v.get("by_rate", {}).items():
                out[f"routers.{key}.rate_{rate}.ontime_utility"] = float(b["ontime_utility"])
                out[f"routers.{key}.rate_{rate}.slo_attainment"] = float(b["slo_attainment"])
    return out


def intervals(r: Result) -> dict[str, tuple[float, float]]:
    """95% intervals over seeds of a sweep's AUCs (``sweep --seeds K``, K >= 2),
    under the names ``flatten`` gives the AUCs."""
    out = {}
    if r.kind == "sweep":
        for key, v in r.metrics.get("routers", {}).items():
            ci = (v.get("auc_ontime_utility_ci") or {}).get("ci95")
            if ci:
                out[f"routers.{key}.auc_ontime_utility"] = (float(ci[0]), float(ci[1]))
    return out


def higher_is_better(name: str) -> bool:
    return name.endswith(HIGHER_IS_BETTER)


def tolerance_for(name: str, overrides: dict[str, float]) -> float:
    for key, value in sorted(overrides.items(), key=lambda kv: -len(kv[0])):
        if name == key or name.endswith("." + key) or name.endswith(key):
            return value
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


def load_baseline(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(path, None, "baseline", "does not exist (create it with --write-baseline)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(path, None, "baseline", f"cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise BadInput(path, e.lineno, "baseline", f"not valid JSON ({e.msg})") from None
    if not isinstance(doc, dict) or doc.get("baseline_version") != BASELINE_VERSION:
        raise BadInput(path, None, "baseline_version", f"not a latroute baseline (expected version {BASELINE_VERSION})")
    metrics = doc.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise BadInput(path, None, "metrics", "missing or empty")
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise BadInput(path, None, f"metrics.{k}", f"not a number: {v!r}")
    return doc


def check_kind(baseline: dict, r: Result, baseline_path: Path) -> None:
    """A baseline compares only with a result of its own kind."""
    kind = baseline.get("kind")
    if kind is not None and kind != r.kind:
        raise BadInput(baseline_path, None, "kind", f"a {kind} baseline cannot check a {r.kind} result ({r.path})")


def baseline_doc(r: Result) -> dict:
    return {"baseline_version": BASELINE_VERSION, "kind": r.kind, "source": str(r.path), "metrics": flatten(r)}


def speed_drift_violations(r: Result, max_drift: float) -> list[str]:
    """Instances whose host speed factor (``estimators.drift``, in estimate
    and validate results) is further than ``max_drift`` from 1, either way."""
    out = []
    for inst, d in (r.metrics.get("drift") or {}).items():
        f = d.get("speed_factor")
        if f is not None and abs(f - 1.0) > max_drift:
            lo, hi = d.get("ci95", [f, f])
            out.append(f"{inst}: speed factor {f:.3f} (95% CI {lo:.3f}-{hi:.3f}) is more than "
                       f"{100 * max_drift:g}% from its profile {d.get('profile')}")
    return out
