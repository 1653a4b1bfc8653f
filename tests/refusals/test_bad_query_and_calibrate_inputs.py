"""Bad input to ``trace query`` (read-only by default, every
escape refused naming the way out) and for ``calibrate`` on degenerate step
logs: each bad input is refused in one line with exit 2 and nothing changed
(split from test_bad_gate_inputs.py, which keeps the CI gate's cases).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_cli
from tests.refusals.test_bad_gate_inputs import _set, write_result
from tests.support.clean_refusal import refused_cleanly

# --------------------------------------------------------------- trace query

@pytest.fixture(scope="module")
def wl(tmp_path_factory):
    out = tmp_path_factory.mktemp("query") / "wl"
    res = run_cli("trace", "generate", "--requests", 40, "--rate", 2, "--out", out)
    assert res.exit_code == 0, res.output
    return out


ESCAPES = [
    "select * from read_csv('/etc/passwd')",
    "select * from read_csv_auto('/etc/passwd')",
    "select * from read_text('/etc/passwd')",
    "select * from read_blob('/etc/hostname')",
    "select * from read_json('/etc/hostname')",
    "from '/etc/passwd'",
    "select * from '/etc/passwd'",
    "select * from glob('/*')",
    "select * from read_parquet('{trace}/requests.parquet')",   # the trace's own file by path: no file access at all
    "select * from read_parquet('https://example.com/x.parquet')",
    "copy requests to '{out}/leak.csv'",
    "copy (select 1 as x) to '{out}/leak.parquet' (format parquet)",
    "copy (select 1 as x) to '{trace}/requests.parquet' (format parquet)",
    "copy (select 1 as x) to '{trace}/requests.parquet' (use_tmp_file false)",
    "copy (select 1 as x) to '{trace}/meta.json' (format csv, use_tmp_file false)",
    "copy requests from '{trace}/requests.parquet'",
    "export database '{out}/exp'",
    "attach '{out}/x.db' as x",
    "attach '{trace}/requests.parquet' as x",
    "install httpfs",
    "force install httpfs",
    "load httpfs",
    "load '{out}/evil.duckdb_extension'",
    "set enable_external_access = true",
    "set global enable_external_access = true",
    "reset enable_external_access",
    "set lock_configuration = false",
    "reset lock_configuration",
    "set allowed_directories = ['/']",
    "set allowed_paths = ['/etc/passwd']",
    "set autoload_known_extensions = true",
    "set autoinstall_known_extensions = true",
    "set python_enable_replacements = true",
    "set temp_directory = '{out}/tmp'",
    "pragma enable_external_access",
    "select 1; copy requests to '{out}/leak.csv'",
]


@pytest.mark.parametrize("sql", ESCAPES)
def test_query_is_read_only_by_default(wl, tmp_path, sql):
    out = tmp_path / "out"
    out.mkdir()
    (out / "evil.duckdb_extension").write_bytes(b"\0" * 64)
    sql = sql.format(trace=wl, out=out)
    refused_cleanly(["trace", "query", wl, sql], [wl, out], str(wl), "SQL")
    assert sorted(p.name for p in out.iterdir()) == ["evil.duckdb_extension"]


@pytest.mark.parametrize("sql", ["select * from read_csv('/etc/passwd')", "copy requests to '{out}/leak.csv'",
                                 "install httpfs", "set enable_external_access = true"])
def test_a_refused_escape_names_the_way_out(wl, tmp_path, sql):
    line = refused_cleanly(["trace", "query", wl, sql.format(out=tmp_path)], [wl, tmp_path], "SQL")
    assert "--unsafe" in line


def test_read_only_query_still_sees_every_table(wl):
    r = run_cli("trace", "query", wl, "select (select count(*) from requests) as r, (select count(*) from quality) as q,"
                " (select count(distinct request_id) from requests join quality using (request_id)) as j",
                "--format", "json")
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)[0]
    assert row["r"] == 40 and row["q"] > 0 and row["j"] == 40


def test_unsafe_lifts_the_sandbox(wl, tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    r = run_cli("trace", "query", wl, f"select a + b as s from read_csv('{tmp_path}/x.csv')", "--unsafe",
                "--format", "csv")
    assert r.exit_code == 0 and r.stdout.splitlines() == ["s", "3"], r.output
    r = run_cli("trace", "query", wl, f"copy (select count(*) as n from requests) to '{tmp_path}/n.csv'", "--unsafe")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "n.csv").read_text().splitlines() == ["n", "40"]


# ----------------------------------------------------------------- calibrate

def _steps(n: int, seed: int = 11) -> pd.DataFrame:
    from estimators.timemodel.builtin_profiles import H100_SIX
    from estimators.timemodel.fit import NoiseModel
    from estimators.timemodel.synthetic_steps import synthetic_steps

    steps, _ = synthetic_steps("six", np.array(H100_SIX["qwen3-8b-h100"]), NoiseModel(log_sigma=0.03), n, seed=seed)
    return steps


def _with_durations(steps: pd.DataFrame, duration: np.ndarray) -> pd.DataFrame:
    end = np.cumsum(duration)
    return steps.assign(start_s=end - duration, end_s=end)


def _steps_trace(path: Path, steps: pd.DataFrame) -> Path:
    from traces.store import TraceWriter

    with TraceWriter(path) as w:
        w.write_table("steps", steps)
    return path


def _identical(n: int) -> pd.DataFrame:
    one = _steps(1)
    steps = pd.concat([one] * n, ignore_index=True).assign(step=np.arange(n))
    rng = np.random.default_rng(0)
    return _with_durations(steps, 0.01 * rng.uniform(0.9, 1.1, n))


def _collinear_six(n: int) -> pd.DataFrame:
    steps = _steps(n)
    return steps.assign(sum_prefill_sq=3 * steps["prefill_tokens"])  # sum(p^2) a multiple of P: six undetermined


def _no_context(n: int) -> pd.DataFrame:
    steps = _steps(n)
    zero = {c: 0 for c in ("sum_ctx", "sum_ctx_sq", "sum_decode_ctx")}
    return steps.assign(**zero)  # every context term 0: neither form determined


def _negative_decode(n: int) -> pd.DataFrame:
    steps = _steps(n)
    p, d = steps["prefill_tokens"].to_numpy(float), steps["decode_tokens"].to_numpy(float)
    return _with_durations(steps, 0.02 + 2e-6 * p - 5e-5 * d)  # a decode makes the step faster: no model of time


@pytest.mark.parametrize("make,form,fragments", [
    (lambda: _steps(3), "both", ["distinct batch shapes"]),
    (lambda: _steps(10), "both", ["eq9: 8 distinct batch shapes", "six: 8 distinct"]),
    (lambda: _steps(20), "both", ["distinct batch shapes"]),
    (lambda: _steps(10), "eq9", ["eq9: 8 distinct batch shapes", "at least 20"]),
    (lambda: _steps(30), "six", ["six: 24 distinct batch shapes", "at least 30"]),
    (lambda: _identical(500), "both", ["1 distinct batch shapes"]),
    (lambda: _with_durations(_steps(500), np.full(500, 0.01)), "both", ["same time"]),
    (lambda: _collinear_six(2000), "six", ["collinear"]),
    (lambda: _no_context(2000), "both", ["eq9: its terms are collinear", "six: its terms are collinear"]),
    (lambda: _negative_decode(2000), "six", ["coefficient D", "negative"]),
    (lambda: _negative_decode(2000), "both", ["cannot calibrate", "negative"]),
])
def test_calibrate_refuses_what_the_steps_cannot_determine(tmp_path, make, form, fragments):
    trace = _steps_trace(tmp_path / "in" / "t", make())
    (tmp_path / "out").mkdir()
    line = refused_cleanly(["calibrate", trace, "--form", form, "--out", tmp_path / "out" / "p.json"],
                           [tmp_path / "in", tmp_path / "out"], str(trace), "steps", *fragments)
    assert "Traceback" not in line


def test_calibrate_leaves_out_only_the_form_that_cannot_be_fitted(tmp_path):
    trace = _steps_trace(tmp_path / "t", _collinear_six(2000))
    r = run_cli("calibrate", trace, "--out", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "p.json").read_text())["form"] == "eq9"


def test_no_fitted_form_has_a_negative_cost_or_a_non_positive_step(tmp_path):
    from estimators.timemodel.calibrate import CalibrationConfig, fit_forms
    from estimators.timemodel.features import design_matrix, term_names
    from estimators.timemodel.profile import NONNEGATIVE_TERMS

    for make in (lambda: _steps(60, seed=3), lambda: _negative_decode(400), lambda: _steps(2000, seed=4)):
        steps = make().assign(trace="mem")
        try:
            results = fit_forms(steps, CalibrationConfig())
        except Exception as e:  # noqa: BLE001 - a refusal is fine; anything else is not
            from traces.errors import BadInput
            assert isinstance(e, BadInput), e
            continue
        for form, r in results.items():
            coef = dict(zip(term_names(form), r.fit.coef))
            assert all(coef[t] >= 0 for t in NONNEGATIVE_TERMS[form]), (form, coef)
            assert np.all(design_matrix(steps, form) @ r.fit.coef > 0), form


# ------------------------------------------------------------------ profiles

def _profile_doc(form: str) -> dict:
    from estimators.timemodel.builtin_profiles import BUILTIN_PROFILES
    from estimators.timemodel.features import FORMS

    doc = copy.deepcopy(BUILTIN_PROFILES["qwen3-8b-h100"])
    if form == "eq9":
        doc["form"] = "eq9"
        doc["coefficients"] = {t.name: {"value": v, "unit": t.unit, "doc": t.doc}
                               for t, v in zip(FORMS["eq9"], (6e-3, 2.2e-5, 4e-8, 6e-10))}
    return doc


@pytest.fixture(scope="module")
def steps_trace(tmp_path_factory):
    return _steps_trace(tmp_path_factory.mktemp("prof") / "t", _steps(300))


@pytest.mark.parametrize("form,term", [("eq9", "const"), ("eq9", "tokens"), ("eq9", "decode_ctx"),
                                       ("eq9", "prefill_attn"), ("six", "const"), ("six", "P"), ("six", "D")])
def test_profile_with_a_negative_cost_is_refused(tmp_path, steps_trace, form, term):
    doc = _profile_doc(form)
    doc["coefficients"][term]["value"] = -1e-6
    (tmp_path / "p.json").write_text(json.dumps(doc))
    refused_cleanly(["trace", "info", steps_trace, "--profile", tmp_path / "p.json"], [tmp_path, steps_trace],
                    "p.json", f"coefficients.{term}", "negative")


@pytest.mark.parametrize("where,literal", [
    ("coefficients/const/value", "NaN"), ("coefficients/P/value", "Infinity"), ("coefficients/D/value", "-Infinity"),
    ("coefficients/sum_ctx/value", "1e999"), ("noise/log_sigma", "NaN"), ("noise/log_mu", "Infinity"),
    ("expected/stall_excess_mean", "Infinity"), ("step_gap_s", "NaN"),
])
def test_profile_with_a_non_finite_number_is_refused(tmp_path, steps_trace, where, literal):
    doc = _set(_profile_doc("six"), where, "@@")
    (tmp_path / "p.json").write_text(json.dumps(doc).replace('"@@"', literal))
    refused_cleanly(["trace", "info", steps_trace, "--profile", tmp_path / "p.json"], [tmp_path, steps_trace],
                    "p.json")


@pytest.mark.parametrize("noise", [{"log_sigma": float("nan")}, {"log_mu": float("inf")},
                                   {"stall_excess_mean": float("nan")},
                                   {"stall_excess_quantiles": {"0": 1.0, "1": float("inf")}}])
def test_profile_noise_must_be_finite_in_memory_too(noise):
    from estimators.timemodel.profile import BatchTimeProfile
    from traces.errors import BadInput

    doc = _profile_doc("six")
    doc["noise"] = {**doc["noise"], **noise}
    with pytest.raises(BadInput) as e:
        BatchTimeProfile.from_json(doc, "mem")
    assert e.value.column == "noise"


def test_six_curvature_terms_may_be_negative(tmp_path, steps_trace):
    doc = _profile_doc("six")
    doc["coefficients"]["sum_prefill_sq"]["value"] = -3e-8   # as the CPU recordings fit it
    doc["coefficients"]["sum_ctx"]["value"] = -7.7e-7
    (tmp_path / "p.json").write_text(json.dumps(doc))
    r = run_cli("trace", "info", steps_trace, "--profile", tmp_path / "p.json")
    assert r.exit_code == 0, r.output


# --------------------------------------------------------------- estimators

@pytest.fixture(scope="module")
def d1(tmp_path_factory):
    from tests.conftest import shared

    out = tmp_path_factory.mktemp("d1")
    rec = shared("vllm_cpu", "d1_tinya_poisson_r3")
    assert run_cli("trace", "import", "vllm-record", rec, "--out", out / "d1").exit_code == 0
    assert run_cli("calibrate", out / "d1", "--form", "six", "--out", out / "six.json").exit_code == 0
    return out


def test_estimators_never_return_a_negative_time(d1):
    """A six profile whose prefill curvature makes every large prefill's step
    negative, and a negative prefill rate for the baselines."""
    from estimators.timemodel.profile import load_profile
    from traces.store import open_trace

    doc = json.loads((d1 / "six.json").read_text())
    doc["coefficients"]["sum_prefill_sq"]["value"] = -1e-5
    doc["derived"]["theta_pre_tokens_per_s"] = -abs(doc["derived"]["theta_pre_tokens_per_s"])
    doc["derived"]["queue"]["b0"] = -abs(doc["derived"]["queue"]["b0"]) - 10
    (d1 / "neg.json").write_text(json.dumps(doc))
    prof = load_profile(d1 / "neg.json")
    assert (prof.typical(open_trace(d1 / "d1").read("steps")) < 0).any(), "the test needs a profile that goes negative"
    out = d1 / "e"
    r = run_cli("estimate", d1 / "d1", "--profile", d1 / "neg.json", "--lengths", "oracle", "--out", out)
    assert r.exit_code == 0, r.output
    est = pd.read_parquet(out / "estimates.parquet")
    assert set(est["estimator"]) == {"sfs", "throughput", "lps", "lps-mg", "queue"}
    finite = est["est_s"][np.isfinite(est["est_s"])]
    assert len(finite) > 0 and (finite >= 0).all(), est.groupby("estimator")["est_s"].min()
    for col in ("p50_s", "p90_s", "p99_s"):
        v = est[col].dropna()
        assert (v[np.isfinite(v)] >= 0).all(), col


@pytest.mark.parametrize("kind,metrics", [("estimate", {"estimators": {}}), ("replay", {}), ("sweep", {"routers": {}})])
def test_a_result_without_metrics_is_not_written_as_a_baseline(tmp_path, kind, metrics):
    res = write_result(tmp_path / "res" / kind, kind, metrics)
    (tmp_path / "ci").mkdir()
    refused_cleanly(["check", res, "--baseline", tmp_path / "ci" / "b.json", "--write-baseline"],
                    [tmp_path / "res", tmp_path / "ci"], "metrics.json", "no metric")
