"""Prefix caching on the real recordings d8-d10: the twin replays d10 with
the hit rate vLLM recorded, and SFS with the cache model beats the same SFS
blind to the cache (which charges every prompt token)."""
from __future__ import annotations

import json

from tests.conftest import run_cli


def test_validate_hit_rate_and_cache_blind_estimate(recordings, tmp_path):
    d10 = recordings / "d10_tinyb_sessions_r0.15_pc"
    res = run_cli("validate", d10, "--calibrate", "--out", tmp_path / "val")
    assert res.exit_code == 0, res.output
    hr = json.loads((tmp_path / "val" / "metrics.json").read_text())["hit_rate"]
    assert abs(hr["twin"] - hr["recorded"]) < 0.01 and hr["recorded"] > 0.5
    # d10 is the only tiny-b recording: calibrated on its first 30% of steps, scored on the rest
    res = run_cli("calibrate", d10, "--steps-window", "0:0.3", "--out", tmp_path / "head.json")
    assert res.exit_code == 0, res.output
    fitted = json.loads((tmp_path / "head.json").read_text())["fitted_on"]
    assert fitted["traces"][0]["window"] == [0.0, 0.3], fitted
    mape, by_share, traj = {}, {}, {}
    for flag in ("", "--cache-blind"):
        args = ["estimate", d10, "--profile", tmp_path / "head.json", "--score-window", "0.3:1", "--lengths", "oracle",
                "--estimators", "sfs", "--out", tmp_path / f"e{flag}"]
        res = run_cli(*(args + ([flag] if flag else [])))
        assert res.exit_code == 0, res.output
        m = json.loads((tmp_path / f"e{flag}" / "metrics.json").read_text())
        mape[flag] = m["estimators"]["sfs"]["mape"]
        by_share[flag] = m["estimators"]["sfs"]["by_cached_share"]
        traj[flag] = m["sfs_attribution"]["trajectory_error"]
        assert m["score_window"] == [0.3, 1.0] and 60 < m["estimators"]["sfs"]["n"] < 120  # the rest only
    assert mape[""] < 0.2 and mape["--cache-blind"] > 3 * mape[""]
    assert traj[""] <= 0.05 < traj["--cache-blind"]  # the trajectory error with the cache model
    # the error by cached share: the blind SFS grows with the share, the cache model does not
    blind, model = by_share["--cache-blind"], by_share[""]
    assert sum(b["n"] for b in model.values()) == m["estimators"]["sfs"]["n"]
    lo, hi = next(iter(blind)), "75-100%"  # the lowest share present, the highest
    assert lo != hi and blind[hi]["mape"] > 1.5 * blind[lo]["mape"] and model[hi]["mape"] < 0.3, (blind, model)
    assert "by_cached_share" in json.loads((tmp_path / "val" / "metrics.json").read_text())["ttft"]
    from reports.results import load_result
    from reports.series import Palette, error_by_cached_share

    results = [load_result(tmp_path / "e"), load_result(tmp_path / "e--cache-blind"), load_result(tmp_path / "val")]
    for r, label in zip(results, ("model", "blind", "val")):
        r.display = label
    spec = error_by_cached_share(results, Palette([]))
    assert {s.label for s in spec.panels[0].series} == {"sfs (model)", "sfs (blind)", "twin (val)"}
    assert "Steepest: sfs (blind)" in spec.caption


def test_cache_aware_baselines_count_only_uncached_prompt_tokens(recordings, tmp_path):
    d8, d9 = recordings / "d8_tinya_sessions_r0.3_pc", recordings / "d9_tinya_sessions_kv64_pc"
    mape = {}
    for flag in ("", "--cache-aware"):
        args = ["estimate", d8, "--calibrate-on", d9, "--estimators", "throughput", "--out", tmp_path / f"e{flag}"]
        res = run_cli(*(args + ([flag] if flag else [])))
        assert res.exit_code == 0, res.output
        mape[flag] = json.loads((tmp_path / f"e{flag}" / "metrics.json").read_text())["estimators"]["throughput"]["mape"]
    assert mape["--cache-aware"] < 0.5 * mape[""], mape


def test_calibrate_says_why_a_form_was_left_out(recordings, tmp_path):
    """On all of d10 the six-term fit needs a negative decode cost: calibrate
    leaves it out and says so beside the forms it compared."""
    res = run_cli("calibrate", recordings / "d10_tinyb_sessions_r0.15_pc", "--out", tmp_path / "p.json")
    assert res.exit_code == 0, res.output
    assert any(ln.startswith("six") and "left out: coefficient D" in ln for ln in res.output.splitlines()), res.output
    assert json.loads((tmp_path / "p.json").read_text())["form"] == "eq9"
