"""``trace import vllm-reqstats``: the two real GPU runs of ../shared/data/vllm_gpu_llmservingsim
(when present), and small runs written here for each way a source can be bad (one line naming
file, row and field; exit 2; nothing written)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_refused, run_cli
from traces.store import open_trace

DATA = Path(__file__).resolve().parents[4] / "shared" / "data" / "vllm_gpu_llmservingsim"
if not DATA.is_dir():
    DATA = Path("/work/shared/data/vllm_gpu_llmservingsim")
R4090, P6000 = DATA / "RTX4090_Llama-3.1-8B", DATA / "RTXPRO6000_Qwen3-32B"
needs_data = pytest.mark.skipif(not R4090.is_dir(), reason="shared GPU runs not present")

CLIENT0, ENGINE0 = 1_700_000_000.0, 5_000.0  # the two clocks' origins in the fixture


def _request(i: int, arrival: float, lag: float = 0.01, ttft: float = 0.5, out: int = 11) -> dict:
    q = ENGINE0 + arrival + lag
    return {"request_id": f"bench-{i}", "input_toks": 100 + i, "output_toks": out, "arrival_time": CLIENT0 + arrival,
            "queued_ts": q, "scheduled_ts": q + 0.001, "first_token_ts": q + ttft, "last_token_ts": q + ttft + 0.2}


def _run(tmp_path: Path, requests: list[dict] | None = None, meta: dict | None = None, series: str | None = None,
         name: str = "run") -> Path:
    d = tmp_path / name
    d.mkdir()
    reqs = requests if requests is not None else [_request(i, 0.5 * i, lag=0.01 * (i % 3)) for i in range(6)]
    (d / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs))
    (d / "timeseries.csv").write_text(series if series is not None else
                                      "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n"
                                      "1.0,300.0,20.0,2,1,12.5\n2.0,400.0,30.0,3,0,25.0\n3.0,0.0,10.0,1,0,6.25\n")
    doc = meta if meta is not None else {
        "vllm_version": "0.19.0", "engine_kwargs": {"max_num_seqs": 8, "max_num_batched_tokens": 512,
                                                    "max_model_len": None, "tensor_parallel_size": 1}}
    (d / "meta.json").write_text(json.dumps(doc))
    return d


def test_fixture_imports_with_aligned_clocks_and_named_sources(tmp_path):
    src = _run(tmp_path)
    res = run_cli("trace", "import", "vllm-reqstats", src, "--out", tmp_path / "t", "--engine", "num_kv_blocks=640")
    assert res.exit_code == 0, res.output
    t = open_trace(tmp_path / "t")
    assert t.tables == ["requests", "engine_series"]
    r = t.read("requests")
    assert r["request_id"].tolist() == list(range(6))
    assert r["arrival_s"].tolist() == pytest.approx([0.5 * i for i in range(6)])
    # the tightest request (lag 0.00) defines the offset: queued = arrival there, the others lag 10 / 20 ms
    lag = (r["added_s"] - r["arrival_s"]).to_numpy()
    assert lag == pytest.approx([0.0, 0.01, 0.02, 0.0, 0.01, 0.02], abs=1e-6)
    assert (r["ttft_s"] - lag).to_numpy() == pytest.approx(np.full(6, 0.5), abs=1e-6)  # first - queued = 0.5 s
    assert (r["finish_s"] - r["added_s"]).to_numpy() == pytest.approx(np.full(6, 0.7), abs=1e-6)
    s = t.read("engine_series")
    assert s["running"].tolist() == [2, 3, 1] and s["t_s"].tolist() == [1.0, 2.0, 3.0]
    eng = t.meta["engine"]
    assert eng["settings"]["num_kv_blocks"] == 640 and eng["sources"]["num_kv_blocks"] == "--engine"
    assert eng["settings"]["max_num_seqs"] == 8 and "engine_kwargs.max_num_seqs" in eng["sources"]["max_num_seqs"]
    assert eng["settings"]["async_scheduling"] is True and eng["marks"]["async_scheduling"] == "defaulted"
    assert "v0.19.0/vllm/config/vllm.py" in eng["sources"]["async_scheduling"]  # the run's version's default
    assert eng["marks"]["num_kv_blocks"] == "given" and eng["marks"]["max_num_seqs"] == "given"
    assert not any("async_scheduling" in w for w in eng["not_modelled"])  # the twin replays vLLM's async rules
    assert "engine num_kv_blocks = 640  [given] --engine" in res.output
    assert t.meta["source"]["clock_alignment"]["offset_s"] == pytest.approx(CLIENT0 - ENGINE0)


def test_kv_blocks_inferred_from_usage_when_the_file_has_none(tmp_path):
    # one request alone, 161 tokens held at t = 5 s while the logger says 50%
    reqs = [{"request_id": "r0", "input_toks": 160, "output_toks": 2, "arrival_time": CLIENT0, "queued_ts": ENGINE0,
             "scheduled_ts": ENGINE0, "first_token_ts": ENGINE0 + 0.1, "last_token_ts": ENGINE0 + 10.0}]
    series = "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n5.0,0,1,1,0,50.0\n"
    src = _run(tmp_path, reqs, {"engine_kwargs": {}}, series)
    res = run_cli("trace", "import", "vllm-reqstats", src, "--out", tmp_path / "t")
    assert res.exit_code == 0, res.output
    eng = open_trace(tmp_path / "t").meta["engine"]
    assert eng["settings"]["num_kv_blocks"] == 22  # 161 tokens = 11 blocks of 16 at 50%
    assert eng["marks"]["num_kv_blocks"] == "inferred" and eng["sources"]["num_kv_blocks"].startswith("kv_cache_pct")


def test_bad_runs_are_refused_with_file_row_and_field(tmp_path):
    ok = [_request(i, 0.5 * i) for i in range(4)]
    missing = [dict(r) for r in ok]
    del missing[2]["first_token_ts"]
    clocks = [dict(r) for r in ok]
    for k in ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts"):
        clocks[3][k] += 3600.0  # an hour after the others: not the same clock
    order = [dict(r) for r in ok]
    order[1]["last_token_ts"] = order[1]["first_token_ts"] - 1.0
    cases = [
        (_run(tmp_path, missing, name="missing"), "requests.jsonl:3: first_token_ts: missing field"),
        (_run(tmp_path, clocks, name="clocks"), "requests.jsonl:4: queued_ts: clocks cannot be aligned"),
        (_run(tmp_path, order, name="order"), "requests.jsonl:2: last_token_ts:"),
        (_run(tmp_path, meta={"resolved_config": {"scheduler_config": {"policy": "lifo"}}}, name="policy"),
         "meta.json: resolved_config.scheduler_config.policy: unknown scheduler policy 'lifo'"),
        (_run(tmp_path, meta={"resolved_config": {"scheduler_config": {"policy": "priority"}}}, name="prio"),
         "priority scheduling policy is not modelled", "--accept-unmodelled policy"),
        (_run(tmp_path, series="t,running\n1,2\n", name="series"), "timeseries.csv:1: prompt_throughput: missing column"),
        (_run(tmp_path, series="t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n1,0,0,1,0,140\n",
              name="pct"), "timeseries.csv:2: kv_cache_pct: value '140' above the maximum 100"),
    ]
    for k, (src, *fragments) in enumerate(cases):
        out = tmp_path / f"out{k}"
        assert_refused(run_cli("trace", "import", "vllm-reqstats", src, "--out", out), out, *fragments)
    out = tmp_path / "outopt"
    assert_refused(run_cli("trace", "import", "vllm-reqstats", _run(tmp_path, name="opt"), "--out", out,
                           "--engine", "watermark=3"), out, "--engine")
    assert_refused(run_cli("trace", "import", "vllm-bench", _run(tmp_path, name="fmt") / "meta.json", "--out", out,
                           "--engine", "num_kv_blocks=3"), out, "input_lens: missing column")
    assert_refused(run_cli("trace", "import", "azure", _run(tmp_path, name="az") / "meta.json", "--out", out,
                           "--engine", "num_kv_blocks=3"), out, "--engine", "only with FORMAT vllm-reqstats")


def test_unmodelled_scheduler_setting_is_refused_unless_accepted(tmp_path):
    meta = {"resolved_config": {"scheduler_config": {"policy": "fcfs", "scheduler_reserve_full_isl": False,
                                                     "async_scheduling": False}}}
    src = _run(tmp_path, meta=meta)
    assert_refused(run_cli("trace", "import", "vllm-reqstats", src, "--out", tmp_path / "t"), tmp_path / "t",
                   "resolved_config.scheduler_config.scheduler_reserve_full_isl", "--accept-unmodelled "
                   "scheduler_reserve_full_isl")
    res = run_cli("trace", "import", "vllm-reqstats", src, "--out", tmp_path / "t",
                  "--accept-unmodelled", "scheduler_reserve_full_isl")
    assert res.exit_code == 0, res.output
    eng = open_trace(tmp_path / "t").meta["engine"]
    assert eng["accepted_unmodelled"] == ["scheduler_reserve_full_isl"]
    assert eng["not_modelled"][0].startswith("resolved_config.scheduler_config.scheduler_reserve_full_isl = false")
    assert eng["settings"]["async_scheduling"] is False
    assert "engine not modelled, accepted: resolved_config.scheduler_config.scheduler_reserve_full_isl" in res.output


@needs_data
def test_real_gpu_runs_import(tmp_path):
    res = run_cli("trace", "import", "vllm-reqstats", R4090, "--out", tmp_path / "a")
    assert res.exit_code == 0, res.output
    t = open_trace(tmp_path / "a")
    r = t.read("requests")
    assert len(r) == 300 and t.read("engine_series")["running"].max() == 49
    ttft_peer = (r["ttft_s"] - (r["added_s"] - r["arrival_s"])).mean()  # first - queued, the peer's TTFT
    assert 1e3 * ttft_peer == pytest.approx(65456.6, abs=0.1)  # llmservingsim_summary.txt's measured mean
    s = t.meta["engine"]["settings"]
    assert (s["num_kv_blocks"], s["block_size"], s["max_num_batched_tokens"], s["max_num_seqs"]) == (2588, 16, 2048, 256)
    assert s["async_scheduling"] is True and "resolved_config" in t.meta["engine"]["sources"]["async_scheduling"]
    res = run_cli("trace", "import", "vllm-reqstats", P6000, "--out", tmp_path / "b")
    assert res.exit_code == 0, res.output
    e = open_trace(tmp_path / "b").meta["engine"]
    assert e["marks"]["num_kv_blocks"] == "defaulted" and "never to bind" in e["sources"]["num_kv_blocks"]
    assert "kv_cache_pct of timeseries.csv is 0 at most" in res.output
    assert e["marks"]["async_scheduling"] == "defaulted" and "vLLM 0.19.0" in e["sources"]["async_scheduling"]
    assert e["settings"]["gpus"] == 2


@needs_data
def test_usage_inference_recovers_the_4090_cache_size(tmp_path):
    """The RTX 4090 run states its KV size (2,588 blocks): hidden, the inference from kv_cache_pct
    must land within 5% of it."""
    d = tmp_path / "nokv"
    d.mkdir()
    for f in ("requests.jsonl", "timeseries.csv"):
        shutil.copy(R4090 / f, d / f)
    meta = json.loads((R4090 / "meta.json").read_text())
    meta.pop("kv_cache")
    meta["resolved_config"]["cache_config"]["num_gpu_blocks"] = None
    (d / "meta.json").write_text(json.dumps(meta))
    assert run_cli("trace", "import", "vllm-reqstats", d, "--out", tmp_path / "t").exit_code == 0
    blocks = open_trace(tmp_path / "t").meta["engine"]["settings"]["num_kv_blocks"]
    assert abs(blocks / 2588 - 1) < 0.05, blocks


# ------------------------------------------------ request-level calibration on the import (no ITLs)

@pytest.fixture(scope="module")
def r4090(tmp_path_factory):
    if not R4090.is_dir():
        pytest.skip("shared GPU runs not present")
    out = tmp_path_factory.mktemp("rq") / "r4090"
    assert run_cli("trace", "import", "vllm-reqstats", R4090, "--out", out).exit_code == 0
    return out


def _copy_with(src: Path, out: Path, edit) -> Path:
    from traces.store import TraceWriter

    t = open_trace(src)
    reqs = edit(t.read("requests"))
    with TraceWriter(out) as w:
        w.meta.update({k: t.meta[k] for k in ("arrivals", "engine", "source")})  # the source names the model and GPU
        w.write_table("requests", reqs)
    return out


def test_calibrate_fits_decode_from_first_and_last_tokens_with_a_fit_window(r4090, tmp_path):
    """No ITLs, only first- and last-token times: the fit runs without numpy warnings, takes the engine
    the run states, fits on the first half's timings only; second-half timings cannot change it."""
    import warnings

    args = ["--max-evals", "8", "--fit-window", "0:0.5"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = run_cli("calibrate", "--from-requests", r4090, *args, "--out", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["fitted_on"]["fit_window"] == [0.0, 0.5] and doc["fitted_on"]["timed_requests"] == 150
    eng = doc["fitted_on"]["engine"]
    assert (eng["num_kv_blocks"], eng["max_model_len"], eng["gpus"]) == (2588, 32768, 1)  # the run's own
    assert eng["async_scheduling"] is True  # the run's own too: the twin replays vLLM's async rules
    assert "host_share" not in doc and "host_fitted" not in doc["fitted_on"]["request_fit"]  # not asked for
    half = 150

    def scramble(r):
        r = r.copy()
        r.loc[half:, "ttft_s"] *= 0.5
        r.loc[half:, "finish_s"] = r.loc[half:, "arrival_s"] + r.loc[half:, "ttft_s"] + 1.0
        return r
    other = _copy_with(r4090, tmp_path / "scrambled", scramble)
    res = run_cli("calibrate", "--from-requests", other, *args, "--out", tmp_path / "b.json")
    assert res.exit_code == 0, res.output
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["coefficients"] == doc["coefficients"]
    assert b["fitted_on"]["request_fit"]["frontend_overhead_s"] == doc["fitted_on"]["request_fit"]["frontend_overhead_s"]
    res = run_cli("validate", r4090, "--profile", tmp_path / "a.json", "--score-window", "0.5:1",
                  "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "v" / "metrics.json").read_text())
    assert m["scored_requests"] == 150 and m["ttft"]["n"] == 150 and m["tpot"]["n"] == 150
    assert m["ttft"]["distribution"]["mean"]["measured"] > 90.0  # the second half waited ~100 s
    ev = m["engine_view"]  # the peer's definitions: from the queued stamp
    assert ev["ttft"]["n"] == 150 and set(ev["within_3pct"]) == {"ttft mean", "ttft p50", "ttft p99", "tpot mean",
                                                                  "e2e mean"}
    r = open_trace(r4090).read("requests")
    second = r.sort_values("arrival_s").iloc[150:]
    peer = (second["arrival_s"] + second["ttft_s"] - second["added_s"]).mean()
    assert ev["ttft"]["mean"]["measured"] == pytest.approx(peer)
    assert ev["queueing"]["mean"]["measured"] == pytest.approx((second["scheduled_s"] - second["added_s"]).mean())
    for k in ("running", "waiting"):
        s = ev["series"][k]
        assert s["samples"] == 184 and 0 <= s["twin_mae"] < s["mean_logged"] and s["stamps_mae"] < 0.2 * s["mean_logged"]
    assert "engine view (TTFT = first token - queued" in res.output and "running series MAE twin" in res.output


def test_calibrate_names_the_missing_last_token_time(r4090, tmp_path):
    only_ttft = _copy_with(r4090, tmp_path / "ttft", lambda r: r.drop(columns=["finish_s"]))
    out = tmp_path / "p.json"
    assert_refused(run_cli("calibrate", "--from-requests", only_ttft, "--out", out), out,
                   "finish_s: missing column: the decode cost is fitted from each request's last-token time")


def test_traces_stating_different_engines_are_not_calibrated_together(tmp_path):
    for name, blocks in (("a", 640), ("b", 1280)):
        res = run_cli("trace", "import", "vllm-reqstats", _run(tmp_path, name=f"src{name}"), "--out", tmp_path / name,
                      "--engine", f"num_kv_blocks={blocks}")
        assert res.exit_code == 0, res.output
    out = tmp_path / "p.json"
    assert_refused(run_cli("calibrate", "--from-requests", tmp_path / "a", tmp_path / "b", "--out", out), out,
                   "b/meta.json: engine.settings.num_kv_blocks: 1280 but")
    assert_refused(run_cli("calibrate", tmp_path / "a", "--fit-window", "0:0.5", "--out", out), out,
                   "--fit-window", "only with --from-requests")


@pytest.mark.realdata  # two request-level calibrations of a real run: ~12 s
def test_calibrate_fits_the_host_part_with_async_on_or_off(r4090, tmp_path):
    """``--fit-host`` fits the host's part of a step too (the gap and the
    host's share), into the profile; ``--engine async_scheduling=false``
    fits the same run under the synchronous rules, and its profile says so."""
    args = ["--max-evals", "4", "--fit-window", "0:0.5", "--fit-host"]
    res = run_cli("calibrate", "--from-requests", r4090, *args, "--out", tmp_path / "a.json")
    assert res.exit_code == 0, res.output
    assert "host: step_gap_s=" in res.output and "async scheduling on" in res.output
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["fitted_on"]["request_fit"]["host_fitted"] == ["step_gap_s", "host_share"]
    assert doc["step_gap_s"] > 0 and 0 < doc["host_share"] <= 0.9
    res = run_cli("calibrate", "--from-requests", r4090, *args, "--engine", "async_scheduling=false",
                  "--out", tmp_path / "b.json")
    assert res.exit_code == 0, res.output
    assert "async scheduling off" in res.output
    assert json.loads((tmp_path / "b.json").read_text())["fitted_on"]["engine"]["async_scheduling"] is False


@pytest.mark.realdata  # a full first-half calibration of the RTX 4090 run: about a minute
def test_rtx4090_second_half_within_3pct_with_async_on_and_off(r4090, tmp_path):
    """docs/results/gpu-fidelity.md: fitted on the first half's timings with
    the run's own async scheduling, the second half's TTFT mean, p50, p99,
    TPOT mean and E2E mean are each within 3%; the same profile replayed
    with the synchronous rules moves none of them by half a point."""
    res = run_cli("calibrate", "--from-requests", r4090, "--fit-window", "0:0.5", "--out", tmp_path / "h1.json")
    assert res.exit_code == 0, res.output
    views = {}
    for mode in ("true", "false"):
        out = tmp_path / f"v-{mode}"
        res = run_cli("validate", r4090, "--profile", tmp_path / "h1.json", "--score-window", "0.5:1",
                      "--engine", f"async_scheduling={mode}", "--out", out)
        assert res.exit_code == 0, res.output
        views[mode] = json.loads((out / "metrics.json").read_text())["engine_view"]
    assert all(views["true"]["within_3pct"].values()), views["true"]["within_3pct"]
    for m, q in (("ttft", "mean"), ("ttft", "p50"), ("ttft", "p99"), ("tpot", "mean"), ("e2e", "mean")):
        assert abs(views["true"][m][q]["error"] - views["false"][m][q]["error"]) < 0.005, (m, q)
