"""Options slice: ``trace join`` inputs, request-level calibration
and validation, and options that do nothing or conflict. Each case failed on
main (4ddc67d): an internal error, a silent wrong result, or an option
accepted although it did nothing."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_cli
from tests.support.clean_refusal import refused_cleanly
from traces.store import TraceWriter, open_trace

FIELDS = ("id", "arrival_s", "added_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s",
          "ttft_s", "hash_ids", "cached_tokens", "client_id", "status")


def client_trace(path: Path, ids: list[str], ttft: list[float]) -> Path:
    with TraceWriter(path) as w:
        w.meta["source"] = {"kind": "loadgen"}
        w.write_table("requests", pd.DataFrame({
            "request_id": np.arange(len(ids), dtype=np.int64), "arrival_s": np.arange(len(ids)) * 0.1,
            "prompt_tokens": np.full(len(ids), 10), "output_tokens": np.full(len(ids), 2), "ttft_s": ttft,
            "client_id": ids, "status": ["ok"] * len(ids), "e2e_s": np.array(ttft) + 0.05}))
    return path


def recording_lines(rows: list[tuple[str, str, float, float]]) -> list[str]:
    """requests.csv lines as the recorder writes them (header first)."""
    lines = [",".join(FIELDS)]
    for rid, cid, arrival, ttft in rows:
        lines.append(f"{rid},{arrival},{arrival},10,2,{arrival + ttft},{arrival + ttft + 0.04},{ttft},,0,{cid},"
                     "finished_stopped")
    return lines


ROWS = [("cmpl-w-0-aaaaaaaa", "w", 0.0, 0.01), ("cmpl-t-1-0-bbbbbbbb", "t-1", 0.1, 0.05),
        ("cmpl-t-0-0-cccccccc", "t-0", 0.2, 0.04)]


def write_recording(d: Path, data: bytes | str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "engine.json").write_text(json.dumps({"budget": 512, "max_seqs": 64, "block_size": 128,
                                               "num_kv_blocks": 1000, "model": "m", "vllm_version": "0.32.0"}))
    p = d / "requests.csv"
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return d


@pytest.fixture
def client(tmp_path):
    return client_trace(tmp_path / "c", ["t-0", "t-1"], [0.05, 0.06])


GOOD = "\n".join(recording_lines(ROWS)) + "\n"

# (name, requests.csv content, fragments of the refusal: file[:row], column)
JOIN_CASES = [
    ("empty", b"", ["requests.csv", "file"]),
    ("header only", ",".join(FIELDS) + "\n", ["requests.csv:2", "no data rows"]),
    ("latin-1", GOOD.replace("t-1,finished", "t-\xe91,finished").encode("latin-1"), ["requests.csv:3", "encoding"]),
    ("utf-16", GOOD.encode("utf-16"), ["requests.csv:1", "encoding"]),
    ("duplicate id", GOOD.replace("cmpl-t-0-0-cccccccc", "cmpl-t-1-0-bbbbbbbb"), ["requests.csv:4", "id"]),
    ("no ttft column", "\n".join(",".join(ln.split(",")[:7] + ln.split(",")[8:]) for ln in GOOD.splitlines()),
     ["requests.csv:1", "ttft_s"]),
    ("duplicate column", GOOD.replace("hash_ids", "ttft_s", 1), ["requests.csv:1", "ttft_s", "duplicate"]),
    ("extra field", GOOD.replace("finished_stopped\n", "finished_stopped,x\n", 1), ["requests.csv:2", "row"]),
    ("short row", GOOD.replace(",finished_stopped\n", "\n", 1), ["requests.csv:2", "row"]),
    ("blank line", GOOD.replace("\n", "\n\n", 1), ["requests.csv:2", "row", "blank"]),
    ("nan ttft", GOOD.replace(",0.05,,0,t-1", ",nan,,0,t-1"), ["requests.csv:3", "ttft_s"]),
    ("inf arrival", GOOD.replace("cmpl-t-1-0-bbbbbbbb,0.1,", "cmpl-t-1-0-bbbbbbbb,inf,"), ["requests.csv:3", "arrival_s"]),
    ("negative ttft", GOOD.replace(",0.05,,0,t-1", ",-0.05,,0,t-1"), ["requests.csv:3", "ttft_s"]),
    ("huge time", GOOD.replace(",0.05,,0,t-1", ",1e300,,0,t-1"), ["requests.csv:3", "ttft_s"]),
    ("finish before arrival", "\n".join(recording_lines(ROWS[:1])) + "\nr1,0.5,0.5,10,2,0.55,0.3,0.05,,0,t-1,x\n",
     ["requests.csv:3", "finish_s"]),
    ("first token after finish", "\n".join(recording_lines(ROWS[:1])) + "\nr1,0.5,0.5,10,2,0.55,0.52,0.05,,0,t-1,x\n",
     ["requests.csv:3", "ttft_s"]),
    ("missing id", GOOD.replace("cmpl-t-0-0-cccccccc", ""), ["requests.csv:4", "id"]),
    ("nul byte", GOOD.replace("t-1,finished", "t-1\0,finished"), ["requests.csv:3", "row"]),
    ("stray quote", GOOD.replace(",t-1,", ',"t-1,'), ["requests.csv", "row"]),
]


@pytest.mark.parametrize("name,data,fragments", JOIN_CASES, ids=[c[0] for c in JOIN_CASES])
def test_join_refuses_a_corrupt_recording_naming_file_row_column(tmp_path, client, name, data, fragments):
    rec = write_recording(tmp_path / "rec", data)
    refused_cleanly(["trace", "join", client, rec, "--out", tmp_path / "j"], [tmp_path], *fragments)


def test_join_strips_a_utf8_byte_order_mark(tmp_path, client):
    rec = write_recording(tmp_path / "rec", b"\xef\xbb\xbf" + GOOD.encode())
    res = run_cli("trace", "join", client, rec, "--out", tmp_path / "j")
    assert res.exit_code == 0, res.output
    per = pd.read_parquet(tmp_path / "j" / "join.parquet").set_index("client_id")
    assert per.loc["t-0", "engine_ttft_s"] == pytest.approx(0.04) and per.loc["t-1", "overhead_s"] == pytest.approx(0.01)


def test_join_refuses_a_client_trace_with_repeated_ids_or_no_ttft(tmp_path):
    rec = write_recording(tmp_path / "rec", GOOD)
    twice = client_trace(tmp_path / "c2", ["t-0", "t-0"], [0.05, 0.06])
    refused_cleanly(["trace", "join", twice, rec, "--out", tmp_path / "j"], [tmp_path], "requests.parquet:2",
                    "client_id")
    with TraceWriter(tmp_path / "c3") as w:
        w.write_table("requests", pd.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [10],
                                                "output_tokens": [2], "client_id": ["t-0"]}))
    refused_cleanly(["trace", "join", tmp_path / "c3", rec, "--out", tmp_path / "j"], [tmp_path], "ttft_s")


def recording_trace(path: Path, rows: list[tuple[str, str, float, float]]) -> Path:
    """The import of ``rows`` as far as a join looks at it: the importer's
    request ids and arrivals, and an instances table (a recording, not a
    request-level trace)."""
    from estimators.engine.config import InstanceConfig, instances_table
    from traces.importers.vllm_record import _request_ids

    ids = _request_ids([r[0] for r in rows])
    with TraceWriter(path) as w:
        w.write_table("requests", pd.DataFrame({
            "request_id": np.array([ids[r[0]] for r in rows], dtype=np.int64),
            "arrival_s": [r[2] for r in rows], "prompt_tokens": 10, "output_tokens": 2,
            "ttft_s": [r[3] for r in rows], "instance_id": "m"}).sort_values("arrival_s"))
        w.write_table("instances", instances_table([InstanceConfig(instance_id="m", model="m")]))
    return path


def test_validate_and_estimate_refuse_a_join_of_another_recording(tmp_path, client):
    from traces.client_join import read_join

    rec = write_recording(tmp_path / "rec", GOOD)
    assert run_cli("trace", "join", client, rec, "--out", tmp_path / "j").exit_code == 0
    mine = recording_trace(tmp_path / "t", ROWS)
    assert len(read_join(tmp_path / "j", open_trace(mine), mine)) == 2  # its own recording: accepted
    other = recording_trace(tmp_path / "o", [(a, b, t + 5.0, f) for a, b, t, f in ROWS])  # same ids, other run
    for cmd in (["validate", other, "--profile", "qwen3-8b-h100"], ["estimate", other, "--profile", "qwen3-8b-h100"]):
        refused_cleanly([*cmd, "--join", tmp_path / "j", "--out", tmp_path / "v"], [tmp_path],
                        "join.json", "recording", "another recording")
    (tmp_path / "j" / "join.parquet").write_bytes(b"PAR1 not parquet")
    refused_cleanly(["validate", mine, "--profile", "qwen3-8b-h100", "--join", tmp_path / "j", "--out",
                     tmp_path / "v"], [tmp_path], "join.parquet", "Parquet")


def request_trace(path: Path, n: int = 12) -> Path:
    """A request-level trace (measured TTFT, no steps): prompts of 100-210 tokens."""
    rng = np.random.default_rng(0)
    arrival = np.cumsum(rng.exponential(0.25, n))
    ttft = 0.05 + rng.uniform(0, 0.02, n)
    out = rng.integers(5, 20, n)
    with TraceWriter(path) as w:
        w.write_table("requests", pd.DataFrame({
            "request_id": np.arange(n, dtype=np.int64), "arrival_s": arrival,
            "prompt_tokens": 100 + 10 * np.arange(n), "output_tokens": out, "ttft_s": ttft,
            "finish_s": arrival + ttft + 0.01 * out}))
    return path


def test_an_engine_that_rejects_every_measured_request_is_refused_before_writing(tmp_path):
    rl = request_trace(tmp_path / "rl")
    refused_cleanly(["calibrate", "--from-requests", rl, "--engine", "max_model_len=5", "--out", tmp_path / "p.json"],
                    [tmp_path], "--engine", "max_model_len=5 rejects 12 of 12 requests")
    refused_cleanly(["calibrate", "--from-requests", rl, "--engine", "num_kv_blocks=1", "--out", tmp_path / "p.json"],
                    [tmp_path], "--engine", "num_kv_blocks=1", "12 of 12")
    for cmd in ("validate", "estimate"):
        refused_cleanly([cmd, rl, "--profile", "qwen3-8b-h100", "--engine", "max_model_len=150", "--out",
                         tmp_path / "v"], [tmp_path], "--engine", "rejects 7 of 12")


def test_request_level_profile_is_byte_identical_across_runs(tmp_path):
    rl = request_trace(tmp_path / "rl")
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        res = run_cli("calibrate", "--from-requests", rl, "--max-evals", "2", "--out", tmp_path / d / "p.json")
        assert res.exit_code == 0, res.output
        assert " s, loss " in res.output  # the wall time is printed, not stored
    a, b = (tmp_path / "a" / "p.json").read_bytes(), (tmp_path / "b" / "p.json").read_bytes()
    assert a == b and b"wall_s" not in a


# (arguments, the option named): each does nothing in the combination given
CALIBRATE_UNUSED = [
    (["--frontend", "measured"], "--frontend"), (["--engine", "max_num_seqs=8"], "--engine"),
    (["--warm", "T"], "--warm"), (["--search-engine"], "--search-engine"), (["--max-evals", "5"], "--max-evals"),
    (["--virtual-engines", "2"], "--virtual-engines"), (["--frontend-per-request", "1"], "--frontend-per-request"),
    (["--search", "max_num_seqs=8,16"], "--search"),
]
FROM_REQUESTS_UNUSED = [
    (["--update", "qwen3-8b-h100"], "--update"), (["--steps-window", "0:0.3"], "--steps-window"),
    (["--form", "eq9"], "--form"), (["--holdout", "0.3"], "--holdout"), (["--seed", "3"], "--seed"),
    (["--evaluate-on", "T"], "--evaluate-on"), (["--loss", "absolute"], "--loss"),
]


@pytest.mark.parametrize("extra,option", CALIBRATE_UNUSED, ids=[c[1] for c in CALIBRATE_UNUSED])
def test_request_level_options_without_from_requests_are_refused(tmp_path, extra, option, monkeypatch):
    t = request_trace(tmp_path / "T")
    monkeypatch.chdir(tmp_path)
    refused_cleanly(["calibrate", t, *extra, "--out", tmp_path / "p.json"], [tmp_path], f"error: {option}:",
                    "--from-requests")


@pytest.mark.parametrize("extra,option", FROM_REQUESTS_UNUSED, ids=[c[1] for c in FROM_REQUESTS_UNUSED])
def test_step_options_with_from_requests_are_refused(tmp_path, extra, option, monkeypatch):
    t = request_trace(tmp_path / "T")
    monkeypatch.chdir(tmp_path)
    refused_cleanly(["calibrate", "--from-requests", t, *extra, "--out", tmp_path / "p.json"], [tmp_path],
                    f"error: {option}:", "--from-requests")


@pytest.mark.parametrize("cmd", ["validate", "estimate"])
@pytest.mark.parametrize("extra,option", [(["--engine", "max_num_seqs=8"], "--engine"),
                                          (["--prefix-cache", "warm"], "--prefix-cache"),
                                          (["--prefix-cache", "cold"], "--prefix-cache")])
def test_engine_options_on_a_recording_are_refused(tmp_path, cmd, extra, option):
    rec = recording_trace(tmp_path / "t", ROWS)
    refused_cleanly([cmd, rec, "--profile", "qwen3-8b-h100", *extra, "--out", tmp_path / "v"], [tmp_path],
                    f"error: {option}:", "request-level", "recording")


@pytest.mark.parametrize("args,option", [
    (["validate", "T", "--profile", "qwen3-8b-h100", "--seed", "3"], "--seed"),  # noise off: nothing drawn
    (["estimate", "T", "--profile", "qwen3-8b-h100", "--speed-half-life", "50"], "--speed-half-life"),
    (["estimate", "T", "--profile", "qwen3-8b-h100", "--recalibration-step", "0.1"], "--recalibration-step"),
    (["estimate", "T", "--profile", "qwen3-8b-h100", "--estimators", "sfs", "--ewma-tau", "5"], "--ewma-tau"),
])
def test_options_that_do_nothing_in_validate_and_estimate_are_refused(tmp_path, monkeypatch, args, option):
    recording_trace(tmp_path / "T", ROWS)
    monkeypatch.chdir(tmp_path)
    refused_cleanly([*args, "--out", tmp_path / "v"], [tmp_path], f"error: {option}:", "only with")


NON_UTF8 = os.fsdecode(b"x\xff")


@pytest.mark.parametrize("args", [
    ["calibrate", "--from-requests", "RL", "--out", f"{NON_UTF8}.json"],
    ["calibrate", "RL", "--out", "p.json", "--name", NON_UTF8],
    ["validate", "RL", "--profile", "qwen3-8b-h100", "--out", NON_UTF8],
    ["estimate", "RL", "--profile", "qwen3-8b-h100", "--out", NON_UTF8],
    ["trace", "join", "RL", "RL", "--out", NON_UTF8],
], ids=["calibrate-out", "calibrate-name", "validate-out", "estimate-out", "join-out"])
def test_a_non_utf8_path_is_refused_at_the_entry(tmp_path, monkeypatch, args):
    request_trace(tmp_path / "RL")
    monkeypatch.chdir(tmp_path)
    line = refused_cleanly(args, [tmp_path], "not valid UTF-8", "x\\xff")
    assert line.split(":")[1].strip() in ("--out", "--name")


@pytest.mark.parametrize("args,option,fragment", [
    (["replay", "--burstiness", "1e-300"], "--burstiness", "[0.01, 100]"),
    (["replay", "--burstiness", "1e300"], "--burstiness", "[0.01, 100]"),
    (["replay", "--metric-percentiles", ""], "--metric-percentiles", "empty"),
    (["replay", "--metric-percentiles", "50,50"], "--metric-percentiles", "repeats"),
    (["replay", "--metric-percentiles", "50,,90"], "--metric-percentiles", "item 2"),
    (["replay", "--goodput", ""], "--goodput", "empty"),
    (["replay", "--goodput", "ttft:100,ttft:200"], "--goodput", "twice"),
    (["replay", "--goodput", "ttft:1e300"], "--goodput", "1e+09"),
    (["replay", "--rate", "1e300"], "--rate", "1e+09"),
    (["replay", "--rate", "1e-300"], "--rate", "0.001"),
    (["trace", "generate", "--requests", "10", "--rate", "1e-300"], "--rate", "0.001"),
    (["validate", "T", "--calibrate", "--metric-percentiles", ""], "--metric-percentiles", "empty"),
    (["trace", "generate", "--requests", "10", "--rate", "1", "--mix", "alpaca=1,alpaca=2"], "--mix", "twice"),
    (["trace", "generate", "--requests", "10", "--rate", "1", "--mix", "alpaca=1,,govreport=1"], "--mix", "empty"),
    (["trace", "generate", "--requests", "10", "--rate", "1", "--mix", ""], "--mix", "empty"),
    (["trace", "generate", "--requests", "10", "--rate", "1", "--burstiness", "1e-300"], "--burstiness", "1e-300"),
    (["sweep", "--rates", "4,4", "--routers", "sfs-hard"], "--rates", "repeats"),
])
def test_nonsensical_option_values_are_refused(tmp_path, monkeypatch, args, option, fragment):
    monkeypatch.chdir(tmp_path)
    refused_cleanly([*args, "--out", tmp_path / "o"], [tmp_path], option, fragment)


@pytest.mark.parametrize("name,change,fragments", [
    ("no output token", lambda d: d.assign(output_tokens=0), ["requests.parquet:1", "output_tokens"]),
    ("finish before first token", lambda d: d.assign(finish_s=d.arrival_s), ["requests.parquet:1", "finish_s"]),
    ("no finish at all", lambda d: d.assign(finish_s=np.nan), ["requests.parquet", "finish_s", "decode cost"]),
])
def test_request_level_calibration_refuses_a_trace_no_server_produced(tmp_path, name, change, fragments):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rl = request_trace(tmp_path / "rl")
    df = change(pd.read_parquet(rl / "requests.parquet"))
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), rl / "requests.parquet")
    refused_cleanly(["calibrate", "--from-requests", rl, "--max-evals", "2", "--out", tmp_path / "p.json"],
                    [tmp_path], *fragments)
