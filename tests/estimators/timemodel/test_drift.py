"""Host drift: the speed factor of a trace against a profile, online speed
correction, quick recalibration and the drift gate — on synthetic steps
with a known speed, and on the real second-host recordings (d1b, d1c)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from estimators.timemodel.builtin_profiles import H100_SIX
from estimators.timemodel.calibrate import CalibrationConfig, StepData, build_profile, fit_forms
from estimators.timemodel.drift import median_ci, speed_drift
from estimators.timemodel.fit import NoiseModel
from estimators.timemodel.online_speed import (
    OnlineSpeedConfig,
    running_factors,
    step_log_ratios,
    steps_to_converge,
)
from estimators.timemodel.rescale import learning_curve, update_profile
from estimators.timemodel.synthetic_steps import synthetic_steps
from tests.conftest import run_cli, shared

COEF = np.array(H100_SIX["qwen3-8b-h100"])
NOISE = NoiseModel(log_sigma=0.2, p_stall=0.005, stall_excess_mean=3.0)


def _profile(seed: int = 0, n: int = 4000):
    steps, _ = synthetic_steps("six", COEF, NOISE, n_steps=n, seed=seed)
    cfg = CalibrationConfig(forms=("six",), seed=seed)
    res = fit_forms(steps.assign(trace="synthetic"), cfg)
    return build_profile("synthetic", res["six"], StepData(steps), cfg)


def _slower(factor: float, seed: int, n: int = 3000):
    steps, _ = synthetic_steps("six", COEF * factor, NOISE, n_steps=n, seed=seed)
    return steps


def test_median_interval_covers_the_median():
    rng = np.random.default_rng(0)
    covered = sum(lo <= 1.0 <= hi for lo, hi in
                  (median_ci(np.exp(rng.normal(0, 0.3, 400)))[1:] for _ in range(400)))
    assert 0.92 <= covered / 400 <= 0.99


def test_speed_factor_is_one_on_the_profiles_own_host_and_found_on_a_slower_one():
    prof = _profile()
    same = speed_drift(prof, _slower(1.0, seed=11))
    assert abs(same.overall.factor - 1) < 0.02 and not same.drift, same.lines()
    slow = speed_drift(prof, _slower(1.45, seed=12))
    assert slow.overall.ci_low <= 1.45 * 1.01 and slow.overall.ci_high >= 1.45 * 0.99, slow.lines()
    assert slow.drift and slow.overall.factor > slow.overall.band_high
    classes = {c.step_class for c in slow.classes}
    assert {"all", "decode-only", "prefill-heavy"} <= classes | {"decode-only"}
    assert all(abs(c.factor / 1.45 - 1) < 0.05 for c in slow.classes), slow.lines()


def test_online_factor_learns_the_speed_from_completed_steps_only():
    prof = _profile()
    steps = _slower(1.45, seed=13)
    cfg = OnlineSpeedConfig()
    f = running_factors(step_log_ratios(prof, steps, cfg), cfg)
    assert f[0] == 1.0  # before any step completed, nothing is known
    n = steps_to_converge(f, 1.45, 0.05)
    assert n is not None and n < 200, n
    # a lone stall of 30x moves the factor by at most the clip
    log = step_log_ratios(prof, steps, cfg)
    assert np.max(np.abs(log)) <= cfg.clip_log


def test_update_recovers_the_scale_from_few_steps_and_refits_from_many():
    prof = _profile()
    up = update_profile(prof, _slower(1.45, seed=14, n=60))
    assert up.method == "scale" and up.scale == pytest.approx(1.45, rel=0.06)
    again = speed_drift(up.profile, _slower(1.45, seed=15))
    assert abs(again.overall.factor - 1) < 0.03, again.lines()
    big = update_profile(prof, _slower(1.45, seed=16, n=2500))
    assert big.method == "refit"
    curve = learning_curve(prof, _slower(1.45, seed=17, n=2000))
    assert curve["old_mape"] > 0.3 and curve["scale_steps_within_1pt"] is not None
    assert curve["scale_steps_within_1pt"] <= 200, curve


def test_calibrate_update_and_the_drift_gate(tmp_path):
    prof = _profile()
    prof.save(tmp_path / "p.json")
    # a trace to update on: steps only
    from traces.store import TraceWriter

    steps = _slower(1.45, seed=18, n=500)
    with TraceWriter(tmp_path / "slow") as w:
        w.write_table("steps", steps)
    res = run_cli("calibrate", "--update", tmp_path / "p.json", tmp_path / "slow", "--out", tmp_path / "u.json")
    assert res.exit_code == 0, res.output
    assert "DRIFT" in res.output and "scaled by" in res.output
    doc = json.loads((tmp_path / "u.json").read_text())
    assert doc["fitted_on"]["update_method"] == "scale"
    info = run_cli("trace", "info", tmp_path / "slow", "--profile", tmp_path / "u.json")
    assert info.exit_code == 0 and "within the profile's noise" in info.output, info.output


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    out = tmp_path_factory.mktemp("hosts")
    names = {"d1": "d1_tinya_poisson_r3", "d1b": "d1b_tinya_poisson_r3_hostb",
             "d1c": "d1c_tinya_poisson_r3_hostb_run2"}
    for short, full in names.items():
        assert run_cli("trace", "import", "vllm-record", shared("vllm_cpu", full), "--out", out / short).exit_code == 0
    for short in ("d1", "d1b"):
        assert run_cli("calibrate", out / short, "--out", out / f"{short}.json").exit_code == 0
    return out


def _sfs_mape(hosts, trace, profile, *extra):
    res = run_cli("estimate", hosts / trace, "--profile", hosts / f"{profile}.json", "--estimators", "sfs",
                  "--lengths", "oracle", "--out", hosts / f"e-{trace}-{profile}-{len(extra)}", *extra)
    assert res.exit_code == 0, res.output
    return json.loads((hosts / f"e-{trace}-{profile}-{len(extra)}" / "metrics.json").read_text())


def test_online_correction_reaches_the_same_host_ceiling_on_real_recordings(hosts):
    """d1c with d1's profile (first host): uncorrected far off; with online
    correction within 2 points of a profile fitted on d1b (d1c's own host,
    another run: the ceiling, not in-sample)."""
    plain = _sfs_mape(hosts, "d1c", "d1")
    online = _sfs_mape(hosts, "d1c", "d1", "--online-speed", "on")
    ceiling = _sfs_mape(hosts, "d1c", "d1b")
    sfs = lambda m: m["estimators"]["sfs"]["mape"]  # noqa: E731
    assert plain["drift"]["tiny-a"]["drift"] and plain["drift"]["tiny-a"]["speed_factor"] > 1.3
    assert sfs(plain) > sfs(ceiling) + 0.1
    assert sfs(online) <= sfs(ceiling) + 0.02, (sfs(plain), sfs(online), sfs(ceiling))
    gate = run_cli("check", hosts / "e-d1c-d1-0", "--max-speed-drift", "0.1")
    assert gate.exit_code == 1 and "DRIFT tiny-a" in gate.output


def test_validate_reports_the_host_speed_factor(hosts):
    res = run_cli("validate", hosts / "d1c", "--profile", hosts / "d1.json", "--out", hosts / "v-d1c")
    assert res.exit_code == 0, res.output
    assert "DRIFT" in res.output
    m = json.loads((hosts / "v-d1c" / "metrics.json").read_text())
    d = m["drift"]["tiny-a"]
    assert d["drift"] and d["ci95"][0] <= d["speed_factor"] <= d["ci95"][1] and d["speed_factor"] > 1.3


def test_an_instance_with_too_few_steps_has_no_drift_report(tmp_path):
    """A trace where one instance ran a handful of steps (an emulated replica
    next to no request reached): the others are judged, it is left out
    (``estimate`` crashed on it with an IndexError)."""
    from estimators.timemodel.drift import trace_drift
    from traces.store import TraceWriter, open_trace

    prof = _profile()
    busy = _slower(1.0, seed=13, n=400).assign(instance_id="a")
    idle = _slower(1.0, seed=14, n=5).assign(instance_id="b")
    assert speed_drift(prof, idle).classes == []
    with TraceWriter(tmp_path / "t", force=True) as w:
        w.write_table("steps", pd.concat([busy, idle], ignore_index=True))
    reports = trace_drift(open_trace(tmp_path / "t"), {"a": prof, "b": prof})
    assert list(reports) == ["a"] and not reports["a"].drift
