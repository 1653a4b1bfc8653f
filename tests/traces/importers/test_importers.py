"""Importers: small fixtures written here, the real files under
../shared/data when present, and a refusal test for each way a source can be
bad (message names file, row and column; exit 2; nothing written)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_refused, run_cli
from traces.importers import IMPORTERS
from traces.importers.vllm_bench import reconstruct_schedule
from traces.store import open_trace

# --------------------------------------------------------------- fixtures

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
"""
AZURE_2024 = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10 00:00:00.009930+00:00,2162,5
2024-05-10 00:00:00.018023+00:00,2399,7
2024-05-10 00:00:01.000000+00:00,1000,3
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,230,1317,Conversation log
118,GPT-4,417,276,693,Conversation log
130,ChatGPT,300,0,300,API log
140,GPT-4,20,5,25,API log
"""
MOONCAKE = "\n".join(json.dumps(r) for r in [
    {"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]},
    {"timestamp": 0, "input_length": 7322, "output_length": 490, "hash_ids": [0, 14]},
    {"timestamp": 1500, "input_length": 200, "output_length": 3, "hash_ids": []},
]) + "\n"
LMBENCH = """run_id,prompt_tokens,generation_tokens,ttft_s,generation_time_s,user_id,question_id,launch_rel_s,launch_time_epoch,finish_time_epoch
r000,689,275,0.307893,15.65375,,,0.0,1745793830.286183,1745793846.2478287
r001,10,5,0.1,1.0,1,2,0.5,1.0,2.0
r001,20,6,0.2,2.0,2,1,0.0,1.0,2.0
r001,30,7,0.3,3.0,1,1,0.25,1.0,2.0
"""


def bench_json(**over) -> dict:
    doc = {"date": "20250101-000000", "backend": "vllm", "model_id": "m", "num_prompts": 4, "request_rate": 2.0,
           "burstiness": 1.0, "max_concurrency": None, "input_lens": [10, 20, 30, 40], "output_lens": [5, 6, 7, 8],
           "ttfts": [0.1, 0.2, 0.3, 0.4], "itls": [[0.01] * 4, [0.01] * 5, [0.01] * 6, [0.01] * 7],
           "errors": ["", "", "", ""]}
    doc.update(over)
    return doc


def write_recording(d: Path, steps: list[dict] | None = None, requests: str | None = None,
                    engine: dict | None = None) -> Path:
    """A three-request recording in the vllm_cpu format, hand-made."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "engine.json").write_text(json.dumps(engine or {
        "budget": 8, "max_seqs": 4, "block_size": 4, "num_kv_blocks": 10, "model": "toy", "long_prefill": 0,
        "max_model_len": 64, "vllm_version": "0.32.0", "platform": "cpu (test)"}))
    (d / "requests.csv").write_text(requests or (
        "id,arrival_s,added_s,prompt_tokens,output_tokens,first_token_s,finish_s,ttft_s\n"
        "r0,0.0,0.0,10,2,0.2,0.3,0.2\n"
        "r1,0.05,0.1,3,1,0.2,0.2,0.15\n"
        "r2,0.25,0.3,4,1,0.4,0.4,0.15\n"))
    steps = steps if steps is not None else [
        {"step": 0, "start_s": 0.0, "end_s": 0.1, "items": [["r0", 8, 0, 10]], "preempted": []},
        {"step": 1, "start_s": 0.1, "end_s": 0.2, "items": [["r0", 2, 8, 10], ["r1", 3, 0, 3]], "preempted": []},
        {"step": 2, "start_s": 0.2, "end_s": 0.3, "items": [["r0", 1, 10, 10]], "preempted": ["r1"]},
        {"step": 3, "start_s": 0.3, "end_s": 0.4, "items": [["r2", 4, 0, 4]], "preempted": []},
    ]
    (d / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    return d


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def do_import(fmt: str, src: Path, out: Path, *extra) -> tuple:
    res = run_cli("trace", "import", fmt, src, "--out", out, *extra)
    return res, (open_trace(out).read("requests") if res.exit_code == 0 else None)


# --------------------------------------------------------------- small fixtures


def test_azure_fixture_2023_and_2024(tmp_path):
    res, r = do_import("azure", write(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZURE), tmp_path / "a")
    assert res.exit_code == 0, res.output
    assert list(r["prompt_tokens"]) == [374, 396, 879] and list(r["output_tokens"]) == [44, 109, 55]
    assert np.allclose(r["arrival_s"], [0.0, 4.314579, 4.541877])
    assert list(r["task"]) == ["conv"] * 3 and list(r["request_id"]) == [0, 1, 2]
    res, r = do_import("azure", write(tmp_path, "AzureLLMInferenceTrace_code_1week.csv", AZURE_2024), tmp_path / "b")
    assert res.exit_code == 0, res.output
    assert np.allclose(r["arrival_s"], [0.0, 0.008093, 0.99007]) and r["task"].iloc[0] == "code"


def test_trace_query_gives_wall_clock_times_where_the_source_had_them(tmp_path):
    """The README's time-bucket query printed dates in 1970 (the
    trace's seconds taken as Unix time); wall_clock() adds the source's start."""
    do_import("azure", write(tmp_path, "AzureLLMInferenceTrace_conv.csv", AZURE), tmp_path / "a")
    sql = "select date_trunc('second', wall_clock(arrival_s)) s, count(*) n from requests group by 1 order by 1"
    for extra in ([], ["--unsafe"]):
        res = run_cli("trace", "query", tmp_path / "a", sql, "--format", "csv", *extra)
        assert res.exit_code == 0, res.output
        assert res.output.splitlines()[1:] == ["2023-11-16 18:15:46,1", "2023-11-16 18:15:50,1", "2023-11-16 18:15:51,1"]
    # a trace whose times have no wall clock says so instead of inventing 1970
    assert run_cli("trace", "generate", "--requests", 5, "--rate", 1, "--out", tmp_path / "g").exit_code == 0
    res = run_cli("trace", "query", tmp_path / "g", "select wall_clock(arrival_s) from requests")
    assert res.exit_code == 2 and "has no wall clock" in res.stderr


def test_azure_streams_in_chunks(tmp_path):
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [
        f"2023-11-16 18:{15 + i // 60:02d}:{i % 60:02d}.0000000,{i + 1},{i % 7 + 1}" for i in range(1000)]
    src = write(tmp_path, "big.csv", "\n".join(rows))
    res, r = do_import("azure", src, tmp_path / "o", "--chunk-rows", 64)
    assert res.exit_code == 0, res.output
    assert len(r) == 1000 and r["request_id"].tolist() == list(range(1000))
    assert np.allclose(r["arrival_s"], np.arange(1000.0))


def test_burstgpt_fixture_failures_and_model_filter(tmp_path):
    src = write(tmp_path, "BurstGPT_1.csv", BURSTGPT)
    res, r = do_import("burstgpt", src, tmp_path / "all")
    assert res.exit_code == 0, res.output
    assert len(r) == 4 and "dropped 1 failed" in res.stdout
    assert np.allclose(r["arrival_s"], [0, 40, 113, 135])
    res, r = do_import("burstgpt", src, tmp_path / "keep", "--keep-failed")
    assert len(r) == 5 and r["output_tokens"].tolist()[3] == 0
    res, r = do_import("burstgpt", src, tmp_path / "gpt4", "--model", "GPT-4")
    assert res.exit_code == 0, res.output
    assert r["prompt_tokens"].tolist() == [417, 20] and np.allclose(r["arrival_s"], [0, 22])
    assert r["task"].tolist() == ["Conversation log", "API log"]


def test_mooncake_fixture(tmp_path):
    res, r = do_import("mooncake", write(tmp_path, "trace.jsonl", MOONCAKE), tmp_path / "m")
    assert res.exit_code == 0, res.output
    assert np.allclose(r["arrival_s"], [0, 0, 1.5])
    assert r["prompt_tokens"].tolist() == [6758, 7322, 200]
    assert list(r["hash_ids"].iloc[0]) == [0, 1, 2] and len(r["hash_ids"].iloc[2]) == 0
    assert open_trace(tmp_path / "m").meta["hash_block_tokens"] == 512
    bad = write(tmp_path, "bad.jsonl", '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-3]}\n')
    assert_refused(run_cli("trace", "import", "mooncake", bad, "--out", tmp_path / "b"), tmp_path / "b",
                   "bad.jsonl:1", "hash_ids", "[0, 2**62)")


def test_vllm_bench_fixture_schedule_start_times_and_unknown(tmp_path):
    src = write(tmp_path, "run.json", json.dumps(bench_json()))
    res, r = do_import("vllm-bench", src, tmp_path / "v")
    assert res.exit_code == 0, res.output
    assert np.allclose(r["arrival_s"], reconstruct_schedule(4, 2.0, 1.0, 0))
    assert np.allclose(r["ttft_s"], [0.1, 0.2, 0.3, 0.4])
    assert np.allclose(r["finish_s"], r["arrival_s"] + r["ttft_s"] + [0.04, 0.05, 0.06, 0.07])
    assert open_trace(tmp_path / "v").meta["arrivals"] == "reconstructed"
    # vllm bench serve (0.33) gaps the first request too and rescales the last time to n / rate
    src = write(tmp_path, "modern.json", json.dumps(bench_json(endpoint_type="openai")))
    res, r = do_import("vllm-bench", src, tmp_path / "modern")
    assert np.allclose(r["arrival_s"], reconstruct_schedule(4, 2.0, 1.0, 0, modern=True))
    assert r["arrival_s"].iloc[0] > 0 and r["arrival_s"].iloc[-1] == pytest.approx(4 / 2.0)
    # the seed recorded in the client command is used
    src = write(tmp_path, "seeded.json", json.dumps(bench_json(_client_command="benchmark_serving.py --seed 7")))
    res, r = do_import("vllm-bench", src, tmp_path / "s")
    assert np.allclose(r["arrival_s"], reconstruct_schedule(4, 2.0, 1.0, 7))
    # measured start times win, and out-of-order ones are sorted
    src = write(tmp_path, "st.json", json.dumps(bench_json(start_times=[100.0, 100.5, 100.2, 101.0])))
    res, r = do_import("vllm-bench", src, tmp_path / "st")
    assert res.exit_code == 0, res.output
    assert np.allclose(r["arrival_s"], [0, 0.2, 0.5, 1.0]) and r["prompt_tokens"].tolist() == [10, 30, 20, 40]
    assert "sorted" in res.stdout
    # request_rate inf: all at t = 0; max_concurrency: unknown
    res, r = do_import("vllm-bench", write(tmp_path, "inf.json", json.dumps(bench_json(request_rate="inf"))),
                       tmp_path / "inf")
    assert (r["arrival_s"] == 0).all()
    res, r = do_import("vllm-bench", write(tmp_path, "mc.json", json.dumps(bench_json(max_concurrency=2))),
                       tmp_path / "mc")
    assert res.exit_code == 0 and r["arrival_s"].isna().all()
    assert open_trace(tmp_path / "mc").meta["arrivals"] == "unknown"
    # a failed request makes the run incomplete: refused, naming it, unless --allow-incomplete; then it keeps
    # its row, without a TTFT
    err = write(tmp_path, "err.json", json.dumps(bench_json(errors=["", "boom", "", ""])))
    assert_refused(run_cli("trace", "import", "vllm-bench", err, "--out", tmp_path / "err"), tmp_path / "err",
                   "err.json: num_prompts: incomplete: 1 of 4", "1 failed (request 1 in send order)",
                   "--allow-incomplete")
    res, r = do_import("vllm-bench", err, tmp_path / "err", "--allow-incomplete")
    assert len(r) == 4 and r["ttft_s"].isna().tolist() == [False, True, False, False]
    assert open_trace(tmp_path / "err").meta["completeness"]["missing"] == 1


def test_lmbench_fixture_run_selection_and_sort(tmp_path):
    src = write(tmp_path, "per_request.csv", LMBENCH)
    res, r = do_import("lmbench", src, tmp_path / "r", "--run", "r001")
    assert res.exit_code == 0, res.output
    assert r["prompt_tokens"].tolist() == [20, 30, 10] and np.allclose(r["arrival_s"], [0, 0.25, 0.5])
    assert np.allclose(r["finish_s"], r["arrival_s"] + r["ttft_s"] + [2.0, 3.0, 1.0])
    assert "sorted 3 requests by launch time" in res.stdout
    assert_refused(run_cli("trace", "import", "lmbench", src, "--out", tmp_path / "x"), tmp_path / "x",
                   "run_id", "--run")
    assert_refused(run_cli("trace", "import", "lmbench", src, "--run", "r999", "--out", tmp_path / "y"),
                   tmp_path / "y", "run_id", "r999")


def test_vllm_record_fixture(tmp_path):
    rec = write_recording(tmp_path / "rec")
    res = run_cli("trace", "import", "vllm-record", rec, "--out", tmp_path / "t")
    assert res.exit_code == 0, res.output
    t = open_trace(tmp_path / "t")
    r, steps, items = t.read("requests"), t.read("steps"), t.read("step_items")
    assert r["request_id"].tolist() == [0, 1, 2] and (r["instance_id"] == "toy").all()
    assert np.allclose(r["ttft_s"], [0.2, 0.15, 0.15])
    assert steps["step"].tolist() == [0, 1, 2, 3]
    assert steps["prefill_tokens"].tolist() == [8, 5, 0, 4] and steps["decode_tokens"].tolist() == [0, 0, 1, 0]
    assert steps["num_preempted"].tolist() == [0, 0, 1, 0]
    assert items[["step", "request_id", "tokens"]].values.tolist() == [[0, 0, 8], [1, 0, 2], [1, 1, 3], [2, 0, 1], [3, 2, 4]]
    assert t.read("preemptions")[["step", "request_id"]].values.tolist() == [[2, 1]]
    inst = t.read("instances").iloc[0]
    assert (inst["max_num_batched_tokens"], inst["num_kv_blocks"], inst["policy"]) == (8, 10, "vllm-v1")


def test_cli_help_lists_every_importer():
    res = run_cli("trace", "import", "--help")
    for name in IMPORTERS:
        assert name in res.stdout


# --------------------------------------------------------------- bad input


def _csv_cases():
    az = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    ts = "2023-11-16 18:15:4{}.0000000"
    bg = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    lm = LMBENCH.splitlines()[0] + "\n"
    return [
        ("azure", "TIMESTAMP,ContextTokens\n" + ts.format(1) + ",3\n", [], ":1", "GeneratedTokens", "missing column"),
        ("azure", az + f"{ts.format(1)},3,4\n{ts.format(2)},,4\n", [], ":3", "ContextTokens", "missing value"),
        ("azure", az + f"{ts.format(1)},3,4\n{ts.format(2)},abc,4\n", [], ":3", "ContextTokens", "not a number"),
        ("azure", az + f"{ts.format(1)},3,4\n{ts.format(2)},-5,4\n", [], ":3", "ContextTokens", "negative"),
        ("azure", az + f"{ts.format(5)},3,4\n{ts.format(2)},3,4\n", [], ":3", "TIMESTAMP", "not sorted"),
        ("azure", az + f"{ts.format(1)},3,4\nyesterday,3,4\n", [], ":3", "TIMESTAMP", "not a timestamp"),
        ("azure", "", [], ":1", "file", "empty"),
        ("azure", az, [], ":2", "file", "no data rows"),
        ("azure", az + f"{ts.format(1)},3,4\n{ts.format(2)},3\n", [], ":3", "GeneratedTokens", "missing value"),
        ("burstgpt", bg + "5,ChatGPT,472,18,490,Conversation log\n1,ChatGPT,4,1,5,API log\n", [], ":3",
         "Timestamp", "not sorted"),
        ("burstgpt", bg + "5,ChatGPT,nan,18,490,Conversation log\n", [], ":2", "Request tokens", "not a number"),
        ("burstgpt", "Timestamp,Model,Request tokens\n1,a,2\n", [], ":1", "Response tokens", "missing column"),
        ("lmbench", lm + "r001,10,5,0.1,1.0,,,-0.5,1,2\n", ["--run", "r001"], ":2", "launch_rel_s", "negative"),
        ("lmbench", lm + "r001,10,5,NaN,1.0,,,0.5,1,2\n", ["--run", "r001"], ":2", "ttft_s", "not a number"),
        ("lmbench", lm + "r001,10,5,,1.0,,,0.5,1,2\n", ["--run", "r001"], ":2", "ttft_s", "missing value"),
        ("lmbench", "run_id,prompt_tokens\nr001,3\n", ["--run", "r001"], ":1", "generation_tokens", "missing column"),
    ]


@pytest.mark.parametrize("fmt,text,extra,row,column,reason", _csv_cases())
def test_csv_importers_refuse_bad_input(tmp_path, fmt, text, extra, row, column, reason):
    src = write(tmp_path, "src.csv", text)
    res = run_cli("trace", "import", fmt, src, "--out", tmp_path / "out", *extra)
    assert_refused(res, tmp_path / "out", f"src.csv{row}", column, reason)


@pytest.mark.parametrize("lines,row,column,reason", [
    (['{"timestamp": 0, "input_length": 5, "output_length": 1}', '{"timestamp": 1, "input_length": 5}'],
     ":2", "output_length", "missing column"),
    (['{"timestamp": 0, "input_length": 5, "output_length": 1}', '{"timestamp": -1, "input_length": 5, "output_length": 1}'],
     ":2", "timestamp", "negative"),
    (['{"timestamp": 9, "input_length": 5, "output_length": 1}', '{"timestamp": 1, "input_length": 5, "output_length": 1}'],
     ":2", "timestamp", "not sorted"),
    (['{"timestamp": 0, "input_length": NaN, "output_length": 1}'], ":1", "input_length", "not a number"),
    (['{"timestamp": 0, "input_length": 5, "output_length": 1}', '{"timestamp": 1, "input_le'], ":2", "line",
     "not valid JSON"),
    ([], ":1", "file", "empty"),
])
def test_mooncake_refuses_bad_input(tmp_path, lines, row, column, reason):
    src = write(tmp_path, "m.jsonl", "".join(x + "\n" for x in lines))
    assert_refused(run_cli("trace", "import", "mooncake", src, "--out", tmp_path / "out"), tmp_path / "out",
                   f"m.jsonl{row}", column, reason)


@pytest.mark.parametrize("doc,row,column,reason", [
    (bench_json(ttfts=[0.1, 0.2]), "", "ttfts", "has 2 entries"),
    ({k: v for k, v in bench_json().items() if k != "output_lens"}, "", "output_lens", "missing column"),
    (bench_json(ttfts=[0.1, -0.2, 0.3, 0.4]), ":2", "ttfts", "negative"),
    (bench_json(input_lens=[10, 20, "x", 40]), ":3", "input_lens", "not a number"),
    (bench_json(input_lens=[]), "", "input_lens", "no requests"),
    (bench_json(request_rate=-1), "", "request_rate", "positive"),
    ([1, 2, 3], ":1", "file", "not a JSON object"),
])
def test_vllm_bench_refuses_bad_input(tmp_path, doc, row, column, reason):
    src = write(tmp_path, "b.json", json.dumps(doc))
    assert_refused(run_cli("trace", "import", "vllm-bench", src, "--out", tmp_path / "out"), tmp_path / "out",
                   f"b.json{row}", column, reason)
    src = write(tmp_path, "t.json", json.dumps(bench_json())[:-20])
    assert_refused(run_cli("trace", "import", "vllm-bench", src, "--out", tmp_path / "out"), tmp_path / "out",
                   "t.json", "not valid JSON")


def test_vllm_record_refuses_bad_input(tmp_path):
    good = [{"step": 0, "start_s": 0.0, "end_s": 0.1, "items": [["r0", 8, 0, 10]], "preempted": []}]
    cases = [
        (dict(steps=[{**good[0], "items": [["r9", 8, 0, 10]]}]), "steps.jsonl:1", "items", "unknown request id"),
        (dict(steps=[{**good[0], "end_s": -0.1}]), "steps.jsonl:1", "end_s", "negative"),
        (dict(steps=[good[0], {**good[0], "step": 0}]), "steps.jsonl:2", "step", "not increasing"),
        (dict(steps=[{**good[0], "items": [["r0", -8, 0, 10]]}]), "steps.jsonl:1", "items", "is not [id"),
        (dict(steps=[]), "steps.jsonl:1", "file", "empty"),
        (dict(steps=good, requests="id,arrival_s,added_s,prompt_tokens,output_tokens,first_token_s,finish_s,ttft_s\n"
                       "r0,0.5,0.5,10,2,0.6,0.7,0.1\nr1,0.2,0.2,3,1,0.3,0.4,0.1\n"),
         "requests.csv:3", "arrival_s", "not sorted"),
        (dict(requests="id,arrival_s,prompt_tokens\nr0,0.5,10\n"), "requests.csv:1", "added_s", "missing column"),
        (dict(engine={"budget": 8, "max_seqs": 4, "block_size": 4, "model": "toy"}), "engine.json", "num_kv_blocks",
         "missing"),
    ]
    for i, (kw, where, column, reason) in enumerate(cases):
        rec = write_recording(tmp_path / f"rec{i}", **kw)
        assert_refused(run_cli("trace", "import", "vllm-record", rec, "--out", tmp_path / f"out{i}"),
                       tmp_path / f"out{i}", where, column, reason)
    assert_refused(run_cli("trace", "import", "vllm-record", tmp_path / "rec0" / "engine.json", "--out",
                           tmp_path / "o"), tmp_path / "o", "recording directory")


def test_unknown_format_and_missing_source(tmp_path):
    src = write(tmp_path, "x.csv", AZURE)
    assert_refused(run_cli("trace", "import", "parquetish", src, "--out", tmp_path / "o"), tmp_path / "o",
                   "x.csv", "FORMAT", "unknown format")
    assert_refused(run_cli("trace", "import", "azure", tmp_path / "nope.csv", "--out", tmp_path / "o"),
                   tmp_path / "o", "nope.csv", "does not exist")
    # a JSON file fed to the CSV importer: refused by its header
    src = write(tmp_path, "y.csv", json.dumps(bench_json()))
    assert_refused(run_cli("trace", "import", "azure", src, "--out", tmp_path / "o"), tmp_path / "o",
                   "y.csv:1", "missing column")
