"""Bad input to the CI gate (``check``), calibration
and ``trace query``: every bad input is refused in one line with exit 2 and
nothing changed (``tests.support.clean_refusal.refused_cleanly``), and the behaviours
that used to be silently wrong are asserted directly.

The result directories are written by hand (a header, the metrics the gate
reads, a tiny Parquet table) so that each case corrupts exactly one thing.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_cli
from tests.support.clean_refusal import refused_cleanly

HEADER = {"schema_version": 1, "latroute_version": "test", "command": "latroute test"}
METRICS = {
    "estimate": {"estimators": {"sfs": {"mape": 0.10, "median_ape": 0.05, "p90_ape": 0.2, "p99_ape": 0.4},
                                "throughput": {"mape": 0.30, "median_ape": 0.2, "p90_ape": 0.6, "p99_ape": 0.9}},
                 "sfs_attribution": {"trajectory_error": 0.03}},
    "validate": {"ttft": {"mape": 0.12, "median_ape": 0.08, "p90_ape": 0.25},
                 "decision_agreement": {"rate": 1.0}},
    "replay": {"ontime_utility": 0.8, "slo_attainment": 0.9, "mean_utility": 0.7, "ttft_p90_s": 1.5},
    "sweep": {"routers": {"sfs-hard": {"auc_ontime_utility": 0.8, "auc_ontime_utility_ci": {"ci95": [0.75, 0.85]},
                                       "by_rate": {"4.0": {"ontime_utility": 0.9, "slo_attainment": 0.95}}},
                          "shortest-queue": {"auc_ontime_utility": 0.7,
                                             "by_rate": {"4.0": {"ontime_utility": 0.8, "slo_attainment": 0.9}}}}},
}
TABLE = {"estimate": "estimates.parquet", "sweep": "results.parquet"}
KINDS = tuple(METRICS)


def write_result(path: Path, kind: str, metrics: dict | None = None, text: str | None = None) -> Path:
    """A result directory of ``kind``: metrics.json (``text`` verbatim, or
    the header plus ``metrics``) and the table its kind needs."""
    path.mkdir(parents=True, exist_ok=True)
    doc = {"kind": kind, **HEADER, **(METRICS[kind] if metrics is None else metrics)}
    (path / "metrics.json").write_text(text if text is not None else json.dumps(doc))
    if kind in TABLE:
        pd.DataFrame({"x": [1, 2]}).to_parquet(path / TABLE[kind])
    return path


def write_baseline(path: Path, kind: str, **changes) -> Path:
    from reports.check import flatten
    from reports.results import load_result

    res = write_result(path.parent / f"src-{kind}", kind)
    doc = {"baseline_version": 1, "kind": kind, "source": str(res), "metrics": flatten(load_result(res))}
    doc.update(changes)
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture
def gate(tmp_path):
    """An estimate result and its baseline, in two watched directories."""
    res = write_result(tmp_path / "res" / "est", "estimate")
    (tmp_path / "ci").mkdir()
    base = write_baseline(tmp_path / "ci" / "b.json", "estimate")
    return res, base, [tmp_path / "res", tmp_path / "ci"]


def _set(doc: dict, dotted: str, value) -> dict:
    doc = copy.deepcopy(doc)
    *path, last = dotted.split("/")
    d = doc
    for k in path:
        d = d[k]
    if value is _DELETE:
        del d[last]
    else:
        d[last] = value
    return doc


_DELETE = object()
NUMBER_LITERALS = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]


# ------------------------------------------------------------------ results

@pytest.mark.parametrize("literal", NUMBER_LITERALS)
@pytest.mark.parametrize("key", ["estimators/sfs/mape", "estimators/throughput/p99_ape",
                                 "sfs_attribution/trajectory_error"])
def test_non_finite_result_metric_is_refused(gate, literal, key):
    res, base, watch = gate
    doc = _set({"kind": "estimate", **HEADER, **METRICS["estimate"]}, key, "@@")
    (res / "metrics.json").write_text(json.dumps(doc).replace('"@@"', literal))
    refused_cleanly(["check", res, "--baseline", base], watch, "metrics.json")


@pytest.mark.parametrize("literal", NUMBER_LITERALS)
def test_non_finite_result_is_not_written_as_a_baseline(tmp_path, literal):
    res = write_result(tmp_path / "res" / "est", "estimate")
    text = (res / "metrics.json").read_text().replace("0.1,", f"{literal},", 1)
    (res / "metrics.json").write_text(text)
    (tmp_path / "ci").mkdir()
    refused_cleanly(["check", res, "--baseline", tmp_path / "ci" / "b.json", "--write-baseline"],
                    [tmp_path / "res", tmp_path / "ci"], "metrics.json")


@pytest.mark.parametrize("kind,key,value,column", [
    ("estimate", "estimators/sfs/mape", None, "estimators.sfs.mape"),          # a NaN written as null
    ("estimate", "estimators/sfs/mape", "0.1", "estimators.sfs.mape"),
    ("estimate", "estimators/sfs/mape", True, "estimators.sfs.mape"),
    ("estimate", "estimators/sfs/mape", [0.1], "estimators.sfs.mape"),
    ("estimate", "estimators/sfs", [0.1], "estimators.sfs"),
    ("estimate", "estimators", ["sfs"], "estimators"),
    ("estimate", "estimators", "sfs", "estimators"),
    ("estimate", "sfs_attribution", [1], "sfs_attribution"),
    ("validate", "ttft", _DELETE, "ttft"),
    ("validate", "ttft", [0.1], "ttft"),
    ("validate", "ttft/mape", None, "ttft.mape"),
    ("validate", "decision_agreement", 1.0, "decision_agreement"),
    ("validate", "decision_agreement/rate", "all", "decision_agreement.rate"),
    ("replay", "ontime_utility", None, "ontime_utility"),
    ("replay", "ttft_p90_s", {"s": 1}, "ttft_p90_s"),
    ("sweep", "routers", [], "routers"),
    ("sweep", "routers/sfs-hard", 0.8, "routers.sfs-hard"),
    ("sweep", "routers/sfs-hard/auc_ontime_utility", _DELETE, "routers.sfs-hard.auc_ontime_utility"),
    ("sweep", "routers/sfs-hard/by_rate", [0.9], "routers.sfs-hard.by_rate"),
    ("sweep", "routers/sfs-hard/by_rate/4.0/slo_attainment", _DELETE, "slo_attainment"),
    ("sweep", "routers/sfs-hard/by_rate/4.0/ontime_utility", "high", "ontime_utility"),
])
def test_malformed_result_metrics_are_refused(tmp_path, kind, key, value, column):
    res = write_result(tmp_path / "res" / kind, kind, _set(METRICS[kind], key, value))
    (tmp_path / "ci").mkdir()
    base = write_baseline(tmp_path / "ci" / "b.json", kind)
    refused_cleanly(["check", res, "--baseline", base], [tmp_path / "res", tmp_path / "ci"], "metrics.json", column)


@pytest.mark.parametrize("text,fragment", [
    ("[1, 2]", "not a JSON object"),
    ("null", "not a JSON object"),
    ('"estimate"', "not a JSON object"),
    ("{not json", "not valid JSON"),
    ("", "not valid JSON"),
    ('{"kind": "estimate", "schema_version": 1, "estimators": {"sfs": {"mape": 0.1', "not valid JSON"),
    ("[" * 5000 + "]" * 5000, "nested"),
    ('{"kind": "estimate", "schema_version": "1"}', "schema_version"),
    ('{"kind": "estimate", "schema_version": true}', "schema_version"),
    ('{"kind": "estimate", "schema_version": 99}', "schema_version"),
    ('{"kind": "bogus", "schema_version": 1}', "unknown result kind"),
    ('{"kind": "estimate", "schema_version": 1, "x": ' + "9" * 5000 + "}", "digits"),
])
def test_result_file_that_is_not_a_metrics_object_is_refused(tmp_path, text, fragment):
    res = write_result(tmp_path / "res" / "est", "estimate", text=text)
    (tmp_path / "ci").mkdir()
    base = write_baseline(tmp_path / "ci" / "b.json", "estimate")
    refused_cleanly(["check", res, "--baseline", base], [tmp_path / "res", tmp_path / "ci"], "metrics.json", fragment)


def test_result_metrics_that_are_not_utf8_are_refused(gate):
    res, base, watch = gate
    (res / "metrics.json").write_bytes(b'{"kind": "estimate", "\xff\xfe": 1}')
    refused_cleanly(["check", res, "--baseline", base], watch, "metrics.json", "UTF-8")


@pytest.mark.parametrize("ci,fragment", [([0.9, 0.7], "above"), ([0.7], "[low, high]"), ("0.7-0.9", "[low, high]"),
                                         ([None, 0.9], "null"), (["NaN", 0.9], "NaN")])
def test_malformed_interval_is_refused_under_interval(tmp_path, ci, fragment):
    m = _set(METRICS["sweep"], "routers/sfs-hard/auc_ontime_utility_ci/ci95", ci)
    text = json.dumps({"kind": "sweep", **HEADER, **m}).replace('"NaN"', "NaN")
    res = write_result(tmp_path / "res" / "s", "sweep", text=text)
    (tmp_path / "ci").mkdir()
    base = write_baseline(tmp_path / "ci" / "b.json", "sweep")
    refused_cleanly(["check", res, "--baseline", base, "--interval"], [tmp_path / "res", tmp_path / "ci"],
                    "metrics.json", fragment)


# ----------------------------------------------------------------- baselines

@pytest.mark.parametrize("literal", NUMBER_LITERALS)
def test_non_finite_baseline_metric_is_refused(gate, literal):
    res, base, watch = gate
    base.write_text(base.read_text().replace('"estimators.sfs.mape": 0.1', f'"estimators.sfs.mape": {literal}'))
    assert literal in base.read_text()
    refused_cleanly(["check", res, "--baseline", base], watch, "b.json")


@pytest.mark.parametrize("base_kind", KINDS)
@pytest.mark.parametrize("result_kind", KINDS)
def test_a_baseline_checks_only_its_own_kind(tmp_path, base_kind, result_kind):
    from reports.check import a_kind

    res = write_result(tmp_path / "res" / result_kind, result_kind)
    (tmp_path / "ci").mkdir()
    base = write_baseline(tmp_path / "ci" / "b.json", base_kind)
    args = ["check", res, "--baseline", base]
    if base_kind == result_kind:
        r = run_cli(*args)
        assert r.exit_code == 0 and "no regression" in r.stdout, r.output
    else:
        refused_cleanly(args, [tmp_path / "res", tmp_path / "ci"], "kind",
                        f"{base_kind} baseline cannot check {a_kind(result_kind)} result")


@pytest.mark.parametrize("changes,column", [
    ({"kind": None}, "kind"),                                   # written before baselines carried their kind
    ({"kind": "bogus"}, "kind"),
    ({"kind": ["estimate"]}, "kind"),
    ({"kind": "validate"}, "metrics.estimators.sfs.mape"),      # forged kind: the names say estimate
    ({"metrics": {"ttft.mape": 0.1}}, "metrics.ttft.mape"),     # names of another kind under kind estimate
    ({"metrics": {"estimators.sfs.mape": None}}, "metrics.estimators.sfs.mape"),
    ({"metrics": {"estimators.sfs.mape": "0.1"}}, "metrics.estimators.sfs.mape"),
    ({"metrics": {"estimators.sfs.mape": True}}, "metrics.estimators.sfs.mape"),
    ({"metrics": {}}, "metrics"),
    ({"metrics": [0.1]}, "metrics"),
    ({"baseline_version": 2}, "baseline_version"),
    ({"baseline_version": "1"}, "baseline_version"),
])
def test_malformed_baseline_is_refused(gate, changes, column):
    res, base, watch = gate
    doc = json.loads(base.read_text())
    doc.update(changes)
    doc = {k: v for k, v in doc.items() if v is not None}
    base.write_text(json.dumps(doc))
    refused_cleanly(["check", res, "--baseline", base], watch, "b.json", column)


@pytest.mark.parametrize("text,fragment", [
    ("[]", "baseline_version"), ("null", "baseline_version"), ("{bad", "not valid JSON"),
    ("[" * 5000 + "]" * 5000, "nested"), ("", "not valid JSON"),
])
def test_baseline_that_is_not_a_baseline_object_is_refused(gate, text, fragment):
    res, base, watch = gate
    base.write_text(text)
    refused_cleanly(["check", res, "--baseline", base], watch, "b.json", fragment)


def test_baseline_that_is_a_directory_or_absent_is_refused(gate):
    res, base, watch = gate
    refused_cleanly(["check", res, "--baseline", base.parent], watch, "not a regular file")
    refused_cleanly(["check", res, "--baseline", base.parent / "none.json"], watch, "does not exist")


# ---------------------------------------------------------------- tolerances

@pytest.mark.parametrize("item,fragment", [
    ("estimators.sfs.mape=nan", "finite"),
    ("estimators.sfs.mape=NaN", "finite"),
    ("estimators.sfs.mape=inf", "finite"),
    ("estimators.sfs.mape=-inf", "finite"),
    ("estimators.sfs.mape=1e999", "finite"),
    ("estimators.sfs.mape=-0.1", ">= 0"),
    ("estimators.sfs.mape=abc", "finite number"),
    ("estimators.sfs.mape=", "finite number"),
    ("=0.1", "NAME=VALUE"),
    ("estimators.sfs.mape", "NAME=VALUE"),
    ("e=100", "matches no metric"),            # used to loosen every metric ending in "e"
    ("mape=0.1", "matches no metric"),         # a suffix is not a name
    ("sfs.mape=0.1", "matches no metric"),
    ("estimators.sfs.MAPE=0.1", "matches no metric"),
    ("*.nothing=0.1", "matches no metric"),
    ("ttft.mape=0.1", "matches no metric"),    # a metric of another kind
])
def test_bad_tolerance_is_refused(gate, item, fragment):
    res, base, watch = gate
    line = refused_cleanly(["check", res, "--baseline", base, "--tolerance", item], watch, "--tolerance", fragment)
    # the option's type (values) or the gate (names) refuses it, naming the option either way
    assert line.startswith(("error: --tolerance: ", "error: latroute check: --tolerance: ")), line


def test_a_tolerance_given_twice_is_refused(gate):
    res, base, watch = gate
    refused_cleanly(["check", res, "--baseline", base, "--tolerance", "estimators.sfs.mape=0.1",
                     "--tolerance", "estimators.sfs.mape=0.2"], watch, "--tolerance", "twice")


def _worse(tmp_path: Path, factor: float) -> Path:
    m = copy.deepcopy(METRICS["estimate"])
    for s in m["estimators"].values():
        s["mape"] *= factor
    return write_result(tmp_path / "worse", "estimate", m)


@pytest.mark.parametrize("tolerances,exit_code,regressed", [
    ((), 1, {"estimators.sfs.mape", "estimators.throughput.mape"}),
    (("estimators.sfs.mape=0.25",), 1, {"estimators.throughput.mape"}),        # exact: one metric only
    (("*.mape=0.25",), 0, set()),                                               # a glob: every MAPE
    (("estimators.*.mape=0.25",), 0, set()),
    (("*.mape=0.25", "estimators.sfs.mape=0"), 1, {"estimators.sfs.mape"}),     # the exact name wins
    (("*mape=0", "*.mape=0.25"), 0, set()),                                     # then the longest glob
    (("estimators.sfs.median_ape=1",), 1, {"estimators.sfs.mape", "estimators.throughput.mape"}),
])
def test_tolerance_names_match_exactly_and_globs_only_as_globs(gate, tmp_path, tolerances, exit_code, regressed):
    _, base, _ = gate
    worse = _worse(tmp_path, 1.2)
    args = ["check", worse, "--baseline", base, "--json"]
    for t in tolerances:
        args += ["--tolerance", t]
    r = run_cli(*args)
    assert r.exit_code == exit_code, r.output
    rows = json.loads(r.stdout)
    assert {row["metric"] for row in rows if row["verdict"] == "REGRESSED"} == regressed


# ------------------------------------------------------------- output, drift

def _strict(text: str):
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def test_check_json_is_strict_json_with_nulls_for_missing(gate, tmp_path):
    _, base, _ = gate
    m = copy.deepcopy(METRICS["estimate"])
    del m["estimators"]["throughput"]
    res = write_result(tmp_path / "fewer", "estimate", m)
    r = run_cli("check", res, "--baseline", base, "--json")
    assert r.exit_code == 1
    rows = _strict(r.stdout)
    missing = [row for row in rows if row["verdict"] == "missing"]
    assert len(missing) == 4 and all(row["new"] is None and row["change"] is None for row in missing)


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_max_speed_drift_must_be_finite(gate, value):
    res, base, watch = gate
    refused_cleanly(["check", res, "--max-speed-drift", value], watch, "--max-speed-drift")


@pytest.mark.parametrize("drift,column", [
    ({"tiny-a": {"speed_factor": "fast"}}, "drift.tiny-a.speed_factor"),
    ({"tiny-a": {"speed_factor": 1.5, "ci95": [1.4]}}, "drift.tiny-a.ci95"),
    ({"tiny-a": [1.5]}, "drift.tiny-a"),
    ([1.5], "drift"),
])
def test_malformed_drift_is_refused(tmp_path, drift, column):
    m = {**METRICS["estimate"], "drift": drift}
    res = write_result(tmp_path / "res" / "e", "estimate", m)
    refused_cleanly(["check", res, "--max-speed-drift", "0.1"], [tmp_path / "res"], "metrics.json", column)


def test_a_drifted_instance_still_fails_the_gate(tmp_path):
    m = {**METRICS["estimate"], "drift": {"tiny-a": {"speed_factor": 1.5, "ci95": [1.4, 1.6], "profile": "p"}}}
    res = write_result(tmp_path / "e", "estimate", m)
    r = run_cli("check", res, "--max-speed-drift", "0.1")
    assert r.exit_code == 1 and "DRIFT tiny-a" in r.stdout


def test_check_without_baseline_is_one_line(gate):
    res, _, watch = gate
    refused_cleanly(["check", res], watch, "--baseline")
