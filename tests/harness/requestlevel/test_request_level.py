"""Request-level traces (no steps): engine options, calibrate --from-requests,
validate and estimate on a 60-request slice of one real A100 run."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from harness.requestlevel.engine_options import REQUEST_TRACE_DEFAULTS, parse_engine_options, request_engine
from harness.requestlevel.fit import RequestFitConfig, TraceTargets, initial_guess, loss, profile_of
from harness.requestlevel.simplex import nelder_mead
from harness.requestlevel.validate import RequestTrace, ks_statistic, replay_requests
from tests.conftest import assert_refused, run_cli, shared
from traces.errors import BadInput, BadOption
from traces.store import TraceWriter, open_trace

RUN = "serving_meta-llama-Llama-3.3-70B-Instruct_tp8_pp1_sharegpt_qps_16__01_tp8_pp1.json"


@pytest.fixture(scope="module")
def slice_trace(tmp_path_factory):
    """The first 60 requests of the 16 q/s Llama-3.3-70B run."""
    d = tmp_path_factory.mktemp("rl")
    res = run_cli("trace", "import", "vllm-bench", shared("vllm_bench_serving_a100_per_request", "runs", RUN),
                  "--out", d / "full")
    assert res.exit_code == 0, res.output
    reqs = open_trace(d / "full").read("requests").iloc[:60]
    with TraceWriter(d / "s") as w:
        w.write_table("requests", reqs)
    return d / "s"


def test_nelder_mead_finds_a_shifted_quadratic_minimum():
    x, fx, evals = nelder_mead(lambda z: float(((z - np.array([1.0, -2.0, 0.5])) ** 2).sum()), np.zeros(3),
                               max_evals=400, tol=1e-12)
    assert np.allclose(x, [1.0, -2.0, 0.5], atol=1e-3) and fx < 1e-6 and evals <= 400


def test_ks_statistic():
    a = np.arange(10.0)
    assert ks_statistic(a, a) == 0.0
    assert ks_statistic(a, a + 100) == 1.0


def test_engine_options_parse_and_priority():
    assert parse_engine_options(["max_num_seqs=64", "policy=vllm-v0"]) == {"max_num_seqs": 64, "policy": "vllm-v0"}
    with pytest.raises(BadOption):
        parse_engine_options(["max_num_seqs=lots"])
    with pytest.raises(BadOption):
        parse_engine_options(["no_such=1"])
    prof = profile_of(np.array([0.02, 1e-5, 1e-4, 0.0, 0.01]), "p")
    prof.fitted_on = {"engine": {"max_num_batched_tokens": 4096, "max_num_seqs": 128}}
    e = request_engine(prof, {"max_num_seqs": 32})
    assert (e.max_num_batched_tokens, e.max_num_seqs) == (4096, 32)  # profile, then the option wins
    assert request_engine(None).max_num_batched_tokens == REQUEST_TRACE_DEFAULTS.max_num_batched_tokens


def test_twin_in_the_loop_recovers_a_known_profile(slice_trace):
    """Measured TTFTs and ends produced by the twin itself with known values:
    the search from the data-driven start cuts the loss at least fourfold.
    (It does not get the decode constant back: const and per-decode-token
    cost trade off at one load; see the README's request-level section.)"""
    rt = RequestTrace.of(open_trace(slice_trace))
    truth = np.array([0.03, 2e-5, 2e-4, 0.0, 0.015])
    res = replay_requests(rt, profile_of(truth, "truth"), REQUEST_TRACE_DEFAULTS, truth[4])
    reqs = rt.requests.copy()
    reqs["ttft_s"] = res.requests["ttft_s"].to_numpy()
    reqs["finish_s"] = res.requests["finish_s"].to_numpy() + truth[4]
    synth = RequestTrace.from_frame(reqs, "synthetic")
    tg = [TraceTargets.of(synth)]
    w = RequestFitConfig().weights
    x0 = initial_guess([synth])
    z, fz, _ = nelder_mead(lambda z: loss(np.exp(z), REQUEST_TRACE_DEFAULTS, tg, w), np.log(x0), max_evals=150)
    assert loss(truth, REQUEST_TRACE_DEFAULTS, tg, w) == 0.0
    assert fz < 0.25 * loss(x0, REQUEST_TRACE_DEFAULTS, tg, w)


def test_calibrate_validate_estimate_on_a_request_level_slice(slice_trace, tmp_path):
    prof = tmp_path / "p.json"
    res = run_cli("calibrate", "--from-requests", slice_trace, "--max-evals", "25", "--engine", "max_num_seqs=128",
                  "--out", prof)
    assert res.exit_code == 0, res.output
    doc = json.loads(prof.read_text())
    assert doc["fitted_on"]["engine"]["max_num_seqs"] == 128
    assert doc["fitted_on"]["request_fit"]["frontend_overhead_s"] > 0
    assert {"theta_pre_tokens_per_s", "mean_decode_step_s"} <= set(doc["derived"])
    res = run_cli("validate", slice_trace, "--profile", prof, "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "v" / "metrics.json").read_text())
    assert m["request_level"] and m["engine"]["max_num_seqs"] == 128  # the engine travelled in the profile
    # every replayed setting says how it is known: the profile's fitted engine is inferred, nothing unmarked
    marks = m["engine_marks"]
    assert marks["max_num_seqs"]["mark"] == "inferred" and "profile p" in marks["max_num_seqs"]["how"]
    assert {d["mark"] for d in marks.values()} <= {"given", "inferred", "defaulted"}
    assert "engine settings:" in res.output and m["caveats"]["incomplete"] == []
    assert m["ttft"]["n"] == 60 and m["ttft"]["mape"] < 0.6 and m["tpot"]["mape"] < 0.3
    assert set(m["ttft"]["distribution"]) == {"mean", "p50", "p90", "p99"}
    assert open_trace(tmp_path / "v" / "twin").has("steps")
    assert (tmp_path / "v" / "ttft_cdf.png").stat().st_size > 1000
    res = run_cli("estimate", slice_trace, "--profile", prof, "--estimators", "sfs,throughput,lps",
                  "--out", tmp_path / "e")
    assert res.exit_code == 0, res.output
    assert "RECONSTRUCTED" in res.output
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())
    assert m["snapshots"]["kind"] == "reconstructed"
    est = pd.read_parquet(tmp_path / "e" / "estimates.parquet")
    measured = open_trace(slice_trace).read("requests").set_index("request_id")["ttft_s"]
    # scored against the MEASURED TTFT, not the twin's
    assert np.allclose(est["true_s"].to_numpy(), measured.loc[est["request_id"]].to_numpy())
    # LPS takes the instance's own arrival rate before each query, not the calibration's pooled rate: its
    # queueing term (the estimate less the query's own prefill) follows the load
    assert m["lps_arrival_rate"].startswith("online")
    lps = est[est["estimator"] == "lps"]
    prompt = open_trace(slice_trace).read("requests").set_index("request_id")["prompt_tokens"]
    wait = lps["est_s"].to_numpy() - prompt.loc[lps["request_id"]].to_numpy() / doc["derived"]["theta_pre_tokens_per_s"]
    assert np.ptp(wait) > 1e-3


def test_request_level_commands_refuse_a_trace_without_measured_ttft(slice_trace, tmp_path):
    reqs = open_trace(slice_trace).read("requests")
    reqs["ttft_s"] = np.nan
    with TraceWriter(tmp_path / "nottft") as w:
        w.write_table("requests", reqs)
    with pytest.raises(BadInput):
        RequestTrace.of(open_trace(tmp_path / "nottft"))
    res = run_cli("calibrate", "--from-requests", tmp_path / "nottft", "--out", tmp_path / "p.json")
    assert_refused(res, tmp_path / "p.json", "ttft_s", "no measured TTFT")
    res = run_cli("validate", tmp_path / "nottft", "--profile", "qwen3-8b-h100", "--out", tmp_path / "v")
    assert_refused(res, tmp_path / "v", "ttft_s")


def test_ttft_cdf_figure(tmp_path):
    from reports.request_cdf import ttft_cdf_figure

    (tmp_path / "v").mkdir()
    pd.DataFrame({"ttft_true_s": [0.05, 0.06, 0.07], "ttft_twin_s": [0.05, 0.08, np.nan]}).to_parquet(
        tmp_path / "v" / "requests.parquet")
    out = ttft_cdf_figure({"run": tmp_path / "v"}, tmp_path / "f" / "cdf.png")
    assert out.stat().st_size > 1000


def test_virtual_engines_split_requests_and_run_in_parallel(slice_trace):
    """V0 pipeline parallelism as N schedulers: a burst is shared between
    them (fewest residents first), so its TTFTs fall."""
    rt = RequestTrace.of(open_trace(slice_trace))
    reqs = rt.requests.copy()
    reqs["arrival_s"] = 0.0
    burst = RequestTrace.from_frame(reqs, "burst")
    prof = profile_of(np.array([0.03, 2e-5, 2e-4, 0.0, 0.0]), "p")
    one = replay_requests(burst, prof, REQUEST_TRACE_DEFAULTS, 0.0)
    two = replay_requests(burst, prof, REQUEST_TRACE_DEFAULTS, 0.0, virtual_engines=2)
    counts = two.requests["instance_id"].value_counts()
    assert set(counts.index) == {"i0.v0", "i0.v1"} and abs(counts.iloc[0] - counts.iloc[1]) <= 1
    assert two.requests["ttft_s"].mean() < one.requests["ttft_s"].mean()


def test_search_options_grid():
    from harness.requestlevel.engine_options import parse_search_options

    assert parse_search_options(["num_kv_blocks=500,1000", "max_num_seqs=64"]) == {
        "num_kv_blocks": (500, 1000), "max_num_seqs": (64,)}
    with pytest.raises(BadOption):
        parse_search_options(["num_kv_blocks"])


def test_warm_prefix_cache_shortens_long_prompts_ttft(slice_trace, tmp_path):
    rt = RequestTrace.of(open_trace(slice_trace))
    prof = profile_of(np.array([0.02, 1e-4, 1e-4, 0.0, 0.0]), "p")
    cold = \
        replay_requests(rt, prof, REQUEST_TRACE_DEFAULTS, 0.0).requests["ttft_s"].to_numpy()
    warm = replay_requests(rt.warmed("warm"), prof, REQUEST_TRACE_DEFAULTS, 0.0).requests["ttft_s"].to_numpy()
    long_ = rt.requests["prompt_tokens"].to_numpy() > 300
    assert long_.any() and (warm[long_] < cold[long_] - 0.02).all()  # > 284 cached tokens x 1e-4 s
    res = run_cli("calibrate", "--from-requests", slice_trace, "--warm", tmp_path / "other", "--out", tmp_path / "p.json")
    assert_refused(res, tmp_path / "p.json", "--warm")


def test_calibrate_with_virtual_engines_carries_them(slice_trace, tmp_path):
    res = run_cli("calibrate", "--from-requests", slice_trace, "--virtual-engines", "2", "--max-evals", "8",
                  "--out", tmp_path / "p.json")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "p.json").read_text())["fitted_on"]["request_fit"]["virtual_engines"] == 2
    res = run_cli("validate", slice_trace, "--profile", tmp_path / "p.json", "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "v" / "metrics.json").read_text())["virtual_engines"] == 2
