"""Validation at the input boundary: table-driven bad inputs for
every importer, the Parquet reader, meta.json, pool files, engine.json and
recorded steps. Every case is a clean refusal (tests/adversarial.py): exit
2, one ``error:`` line naming file, row and column where there is one, no
traceback, nothing written. The property-based corruptions are in
test_adversarial_inputs_props.py; the recordings that must still import
are at the end of this file."""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.adversarial import refused_cleanly
from tests.conftest import run_cli, shared
from traces.datamodel.limits import MAX_TOKENS

D1 = "d1_tinya_poisson_r3"
BIG = 2**63
HUGE = "9" * 5000

# ------------------------------------------------------------ source files
AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_ROWS = ["2023-11-16 18:15:46.6805900,374,44", "2023-11-16 18:15:50.9951690,396,109",
              "2023-11-16 18:15:51.4405450,879,46"]
BURST_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
BURST_ROWS = ["5,ChatGPT,472,18,490,Conversation log", "45,ChatGPT,1087,8,1095,Conversation log",
              "118,GPT-4,417,276,693,Conversation log"]
LMB_HEAD = "run_id,prompt_tokens,generation_tokens,ttft_s,generation_time_s,launch_rel_s"
LMB_ROWS = ["r1,100,20,0.1,0.5,0.0", "r1,200,30,0.2,0.6,0.5", "r1,300,40,0.3,0.7,1.0"]
MOON_ROWS = [{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]},
             {"timestamp": 500, "input_length": 700, "output_length": 12, "hash_ids": [1, 3]},
             {"timestamp": 900, "input_length": 100, "output_length": 5, "hash_ids": [4]}]
BENCH = {"input_lens": [10, 20, 30], "output_lens": [5, 6, 7], "ttfts": [0.1, 0.2, 0.3], "request_rate": "inf"}

FORMATS = {  # format: (file name, header, rows, extra arguments)
    "azure": ("az_conv.csv", AZURE_HEAD, AZURE_ROWS, []),
    "burstgpt": ("burst.csv", BURST_HEAD, BURST_ROWS, []),
    "lmbench": ("per_request.csv", LMB_HEAD, LMB_ROWS, ["--run", "r1"]),
}


def write_csv(tmp: Path, fmt: str, header: str | None = None, rows: list[str] | None = None) -> Path:
    name, head, body, _ = FORMATS[fmt]
    p = tmp / "src" / name
    p.parent.mkdir(exist_ok=True)
    p.write_text("\n".join([header if header is not None else head, *(rows if rows is not None else body)]) + "\n")
    return p


def import_args(fmt: str, src: Path, tmp: Path) -> list:
    extra = FORMATS[fmt][3] if fmt in FORMATS else []
    return ["trace", "import", fmt, src, "--out", tmp / "out", *extra]


def cell(rows: list[str], r: int, c: int, value: str) -> list[str]:
    out = [row.split(",") for row in rows]
    out[r][c] = value
    return [",".join(x) for x in out]


# (id, format, header or None, rows, fragments): line numbers count the header as line 1
CSV_CASES = [
    ("az-dup-header", "azure", "TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens", None,
     ["az_conv.csv:1", "ContextTokens", "duplicate"]),
    ("az-int64-overflow", "azure", None, cell(AZURE_ROWS, 1, 1, str(BIG)), ["az_conv.csv:3", "ContextTokens", "maximum"]),
    ("az-int64-max", "azure", None, cell(AZURE_ROWS, 0, 2, str(BIG - 1)), ["az_conv.csv:2", "GeneratedTokens", "maximum"]),
    ("az-above-2^53", "azure", None, cell(AZURE_ROWS, 0, 1, str(2**53 + 1)), ["az_conv.csv:2", "ContextTokens"]),
    ("az-above-max-tokens", "azure", None, cell(AZURE_ROWS, 2, 1, str(MAX_TOKENS + 1)), ["az_conv.csv:4", "maximum"]),
    ("az-1e300", "azure", None, cell(AZURE_ROWS, 0, 1, "1e300"), ["az_conv.csv:2", "ContextTokens", "maximum"]),
    ("az-5000-digits", "azure", None, cell(AZURE_ROWS, 0, 2, HUGE), ["az_conv.csv:2", "GeneratedTokens"]),
    ("az-fraction", "azure", None, cell(AZURE_ROWS, 1, 1, "12.5"), ["az_conv.csv:3", "ContextTokens", "whole"]),
    ("az-negative", "azure", None, cell(AZURE_ROWS, 1, 2, "-3"), ["az_conv.csv:3", "GeneratedTokens", "negative"]),
    ("az-nan", "azure", None, cell(AZURE_ROWS, 1, 2, "nan"), ["az_conv.csv:3", "GeneratedTokens"]),
    ("az-inf", "azure", None, cell(AZURE_ROWS, 1, 1, "inf"), ["az_conv.csv:3", "ContextTokens"]),
    ("az-bad-time", "azure", None, cell(AZURE_ROWS, 2, 0, "yesterday"), ["az_conv.csv:4", "TIMESTAMP"]),
    ("bg-dup-header", "burstgpt", BURST_HEAD + ",Model", None, ["burst.csv:1", "Model", "duplicate"]),
    ("bg-int64-overflow", "burstgpt", None, cell(BURST_ROWS, 0, 2, str(BIG)), ["burst.csv:2", "Request tokens"]),
    ("bg-int64-max", "burstgpt", None, cell(BURST_ROWS, 1, 3, str(BIG - 1)), ["burst.csv:3", "Response tokens", "maximum"]),
    ("bg-fraction", "burstgpt", None, cell(BURST_ROWS, 1, 2, "1.5"), ["burst.csv:3", "Request tokens", "whole"]),
    ("bg-time-1e300", "burstgpt", None, cell(BURST_ROWS, 2, 0, "1e300"), ["burst.csv:4", "Timestamp", "maximum"]),
    ("bg-time-5000-digits", "burstgpt", None, cell(BURST_ROWS, 2, 0, HUGE), ["burst.csv:4", "Timestamp"]),
    ("bg-unsorted", "burstgpt", None, cell(BURST_ROWS, 2, 0, "1"), ["burst.csv:4", "Timestamp", "sorted"]),
    ("lm-dup-header", "lmbench", LMB_HEAD + ",ttft_s", None, ["per_request.csv:1", "ttft_s", "duplicate"]),
    ("lm-int64-overflow", "lmbench", None, cell(LMB_ROWS, 1, 1, str(BIG)), ["per_request.csv:3", "prompt_tokens"]),
    ("lm-fraction", "lmbench", None, cell(LMB_ROWS, 0, 2, "2.25"), ["per_request.csv:2", "generation_tokens", "whole"]),
    ("lm-1e300", "lmbench", None, cell(LMB_ROWS, 0, 5, "1e300"), ["per_request.csv:2", "launch_rel_s", "maximum"]),
    ("lm-5000-digits", "lmbench", None, cell(LMB_ROWS, 2, 3, HUGE), ["per_request.csv:4", "ttft_s"]),
]


@pytest.mark.parametrize("fmt,header,rows,fragments", [c[1:] for c in CSV_CASES], ids=[c[0] for c in CSV_CASES])
def test_csv_importers_refuse(tmp_path, fmt, header, rows, fragments):
    src = write_csv(tmp_path, fmt, header, rows)
    refused_cleanly(import_args(fmt, src, tmp_path), [tmp_path], *fragments)


def test_csv_importers_accept_the_valid_files(tmp_path):
    """The base files are valid: every refusal above is the one change."""
    for fmt in FORMATS:
        src = write_csv(tmp_path, fmt)
        res = run_cli(*import_args(fmt, src, tmp_path / fmt))
        assert res.exit_code == 0, (fmt, res.output)


def moon(tmp: Path, rows: list) -> Path:
    p = tmp / "src" / "mooncake.jsonl"
    p.parent.mkdir(exist_ok=True)
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def _moon_set(i: int, key: str, value) -> list:
    rows = [dict(r) for r in MOON_ROWS]
    rows[i][key] = value
    return rows


MOON_CASES = [
    ("int64-overflow", _moon_set(1, "input_length", BIG), ["mooncake.jsonl:2", "input_length", "maximum"]),
    ("int64-max", _moon_set(0, "output_length", BIG - 1), ["mooncake.jsonl:1", "output_length", "maximum"]),
    ("fraction", _moon_set(2, "input_length", 10.5), ["mooncake.jsonl:3", "input_length", "whole"]),
    ("1e300-time", _moon_set(2, "timestamp", 1e300), ["mooncake.jsonl:3", "timestamp", "maximum"]),
    ("NaN-literal", [MOON_ROWS[0], '{"timestamp": NaN, "input_length": 1, "output_length": 1}'],
     ["mooncake.jsonl:2", "NaN"]),
    ("Infinity-literal", [MOON_ROWS[0], '{"timestamp": 1, "input_length": Infinity, "output_length": 1}'],
     ["mooncake.jsonl:2", "Infinity"]),
    ("5000-digits", [MOON_ROWS[0], '{"timestamp": 1, "input_length": ' + HUGE + ', "output_length": 1}'],
     ["mooncake.jsonl:2", "digits"]),
    ("1e400", [MOON_ROWS[0], '{"timestamp": 1e400, "input_length": 1, "output_length": 1}'],
     ["mooncake.jsonl:2", "float"]),
    ("deep-nesting", [MOON_ROWS[0], "[" * 5000 + "]" * 5000], ["mooncake.jsonl:2", "nested"]),
    ("bool-hash", _moon_set(0, "hash_ids", [True]), ["mooncake.jsonl:1", "hash_ids"]),
    ("string-count", _moon_set(1, "output_length", "12"), ["mooncake.jsonl:2", "output_length"]),
]


@pytest.mark.parametrize("rows,fragments", [c[1:] for c in MOON_CASES], ids=[c[0] for c in MOON_CASES])
def test_mooncake_refuses(tmp_path, rows, fragments):
    refused_cleanly(import_args("mooncake", moon(tmp_path, rows), tmp_path), [tmp_path], *fragments)


def bench(tmp: Path, doc: dict | str) -> Path:
    p = tmp / "src" / "bench.json"
    p.parent.mkdir(exist_ok=True)
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


BENCH_CASES = [
    ("int64-overflow", {**BENCH, "input_lens": [10, BIG, 30]}, ["bench.json:2", "input_lens", "maximum"]),
    ("int64-max", {**BENCH, "output_lens": [BIG - 1, 6, 7]}, ["bench.json:1", "output_lens", "maximum"]),
    ("fraction", {**BENCH, "input_lens": [10, 20.5, 30]}, ["bench.json:2", "input_lens", "whole"]),
    ("1e300-ttft", {**BENCH, "ttfts": [0.1, 1e300, 0.3]}, ["bench.json:2", "ttfts", "maximum"]),
    ("NaN", json.dumps(BENCH).replace("0.2", "NaN"), ["bench.json", "NaN"]),
    ("5000-digits", json.dumps(BENCH).replace("[10,", "[" + HUGE + ","), ["bench.json", "digits"]),
    ("deep", '{"a": ' + "[" * 200 + "]" * 200 + "}", ["bench.json", "nested"]),
    ("burstiness-negative", {**BENCH, "request_rate": 2.0, "burstiness": -1}, ["bench.json", "burstiness"]),
    ("burstiness-string", {**BENCH, "request_rate": 2.0, "burstiness": "x"}, ["bench.json", "burstiness"]),
    ("seed-negative", {**BENCH, "request_rate": 2.0, "seed": -1}, ["bench.json", "seed"]),
    ("seed-huge", {**BENCH, "request_rate": 2.0, "seed": BIG}, ["bench.json", "seed"]),
    ("rate-1e300", {**BENCH, "request_rate": 1e300}, ["bench.json", "request_rate"]),
    ("itls-strings", {**BENCH, "itls": [["a"], [0.1], [0.1]]}, ["bench.json:1", "itls"]),
    ("errors-not-list", {**BENCH, "errors": "boom"}, ["bench.json", "errors"]),
    ("a-list", [1, 2], ["bench.json", "not a JSON object"]),
]


@pytest.mark.parametrize("doc,fragments", [c[1:] for c in BENCH_CASES], ids=[c[0] for c in BENCH_CASES])
def test_vllm_bench_refuses(tmp_path, doc, fragments):
    if isinstance(doc, list):
        doc = json.dumps(doc)
    refused_cleanly(import_args("vllm-bench", bench(tmp_path, doc), tmp_path), [tmp_path], *fragments)


# ---------------------------------------------------------- vllm recordings
def small_recording(tmp: Path) -> Path:
    """A consistent prefix of d1: the steps up to a point where every request
    scheduled so far has its first token, and only those requests."""
    src = shared("vllm_cpu", D1)
    dst = tmp / "rec"
    dst.mkdir()
    shutil.copy(src / "engine.json", dst / "engine.json")
    lines = (src / "steps.jsonl").read_text().splitlines(keepends=True)
    header, *rows = (src / "requests.csv").read_text().splitlines(keepends=True)
    first = {r.split(",")[0]: float(r.split(",")[5]) for r in rows}
    seen: set[str] = set()
    for k, text in enumerate(lines):
        step = json.loads(text)
        seen.update(it[0] for it in step["items"])
        if k >= 120 and all(first[r] <= step["end_s"] + 1e-6 for r in seen):
            break
    (dst / "steps.jsonl").write_text("".join(lines[:k + 1]))
    (dst / "requests.csv").write_text(header + "".join(r for r in rows if r.split(",")[0] in seen))
    return dst


def steps_of(rec: Path) -> list[dict]:
    return [json.loads(x) for x in (rec / "steps.jsonl").read_text().splitlines()]


def put_steps(rec: Path, steps: list[dict]) -> None:
    (rec / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))


def edit_steps(fn: Callable[[list[dict]], None]) -> Callable[[Path], None]:
    def apply(rec: Path) -> None:
        steps = steps_of(rec)
        fn(steps)
        put_steps(rec, steps)
    return apply


def edit_engine(**kw) -> Callable[[Path], None]:
    def apply(rec: Path) -> None:
        eng = json.loads((rec / "engine.json").read_text())
        eng.update(kw)
        (rec / "engine.json").write_text(json.dumps(eng))
    return apply


def edit_requests(row: int, col: str, value: str) -> Callable[[Path], None]:
    def apply(rec: Path) -> None:
        head, *rows = (rec / "requests.csv").read_text().splitlines()
        i = head.split(",").index(col)
        cells = rows[row].split(",")
        cells[i] = value
        rows[row] = ",".join(cells)
        (rec / "requests.csv").write_text("\n".join([head, *rows]) + "\n")
    return apply


def _set_item(step: int, item: int, k: int, value):
    def fn(steps):
        steps[step]["items"][item][k] = value
    return edit_steps(fn)


def _set_step(step: int, key: str, value):
    def fn(steps):
        steps[step][key] = value
    return edit_steps(fn)


def _start_before_prev_end(steps):
    steps[5]["start_s"] = steps[4]["end_s"] - 1e-3


def _start_before_prev_start(steps):
    steps[5]["start_s"] = steps[3]["start_s"]
    steps[5]["end_s"] = steps[3]["end_s"]


def _truncate(rec: Path) -> None:
    lines = (rec / "steps.jsonl").read_text().splitlines(keepends=True)
    (rec / "steps.jsonl").write_text("".join(lines[: len(lines) // 2]))


def _raw_line(n: int, text: str):
    def apply(rec: Path) -> None:
        lines = (rec / "steps.jsonl").read_text().splitlines(keepends=True)
        lines[n] = text + "\n"
        (rec / "steps.jsonl").write_text("".join(lines))
    return apply


def _dup_request_row(rec: Path) -> None:
    head, *rows = (rec / "requests.csv").read_text().splitlines()
    (rec / "requests.csv").write_text("\n".join([head, rows[0], *rows]) + "\n")


def _no_request_rows(rec: Path) -> None:
    head = (rec / "requests.csv").read_text().splitlines()[0]
    (rec / "requests.csv").write_text(head + "\n")


def _dup_header(rec: Path) -> None:
    head, *rows = (rec / "requests.csv").read_text().splitlines()
    (rec / "requests.csv").write_text("\n".join([head + ",ttft_s", *[r + ",1" for r in rows]]) + "\n")


RECORD_CASES = [
    ("kv-blocks-2^63", edit_engine(num_kv_blocks=BIG), ["engine.json", "num_kv_blocks"]),
    ("kv-blocks-0", edit_engine(num_kv_blocks=0), ["engine.json", "num_kv_blocks"]),
    ("budget-float", edit_engine(budget=512.5), ["engine.json", "budget"]),
    ("max-model-len-2^63", edit_engine(max_model_len=BIG), ["engine.json", "max_model_len"]),
    ("long-prefill-negative", edit_engine(long_prefill=-1), ["engine.json", "long_prefill"]),
    ("model-not-string", edit_engine(model=[1]), ["engine.json", "model"]),
    ("engine-NaN", lambda r: (r / "engine.json").write_text('{"budget": NaN}'), ["engine.json", "NaN"]),
    ("engine-list", lambda r: (r / "engine.json").write_text("[1, 2]"), ["engine.json", "not a JSON object"]),
    ("item-tokens-2^62", _set_item(3, 0, 1, 2**62), ["steps.jsonl:4", "items"]),
    ("item-tokens-2^63", _set_item(3, 0, 1, BIG), ["steps.jsonl:4", "items"]),
    ("item-ctx-fraction", _set_item(2, 0, 2, 3.5), ["steps.jsonl:3", "items"]),
    ("item-unknown-request", _set_item(2, 0, 0, "nobody"), ["steps.jsonl:3", "items", "unknown request"]),
    ("item-unhashable-id", _set_item(2, 0, 0, [1]), ["steps.jsonl:3", "items"]),
    ("preempted-unhashable", _set_step(2, "preempted", [[1]]), ["steps.jsonl:3", "preempted"]),
    ("step-2^63", _set_step(0, "step", BIG), ["steps.jsonl:1", "step"]),
    ("start-1e300", _set_step(4, "start_s", 1e300), ["steps.jsonl:5", "start_s", "maximum"]),
    ("end-before-start", _set_step(4, "end_s", 0.0), ["steps.jsonl:5", "end_s", "before it starts"]),
    ("overlap", edit_steps(_start_before_prev_end), ["steps.jsonl:6", "start_s", "ended"]),
    ("non-monotone-start", edit_steps(_start_before_prev_start), ["steps.jsonl:6", "start_s", "before step"]),
    ("truncated-at-line", _truncate, ["requests.csv:", "id", "no step", "incomplete"]),
    ("NaN-line", _raw_line(3, '{"step": 3, "start_s": NaN}'), ["steps.jsonl:4", "NaN"]),
    ("deep-line", _raw_line(3, "[" * 3000 + "]" * 3000), ["steps.jsonl:4", "nested"]),
    ("dup-request-id", _dup_request_row, ["requests.csv:3", "id", "duplicate"]),
    ("zero-requests", _no_request_rows, ["requests.csv:2", "no data rows"]),
    ("dup-header", _dup_header, ["requests.csv:1", "ttft_s", "duplicate"]),
    ("prompt-int64-overflow", edit_requests(2, "prompt_tokens", str(BIG)), ["requests.csv:4", "prompt_tokens"]),
    ("prompt-int64-max", edit_requests(2, "prompt_tokens", str(BIG - 1)), ["requests.csv:4", "prompt_tokens", "maximum"]),
    ("prompt-fraction", edit_requests(1, "prompt_tokens", "890.5"), ["requests.csv:3", "prompt_tokens", "whole"]),
    ("output-5000-digits", edit_requests(1, "output_tokens", HUGE), ["requests.csv:3", "output_tokens"]),
    ("arrival-1e300", edit_requests(0, "arrival_s", "1e300"), ["requests.csv:2", "arrival_s", "maximum"]),
    ("finish-missing", edit_requests(0, "finish_s", ""), ["requests.csv:2", "finish_s", "missing"]),
    ("first-token-after-steps", edit_requests(0, "first_token_s", "1e6"), ["requests.csv:2", "first_token_s"]),
]


@pytest.mark.parametrize("corrupt,fragments", [c[1:] for c in RECORD_CASES], ids=[c[0] for c in RECORD_CASES])
def test_vllm_record_refuses(tmp_path, corrupt, fragments):
    rec = small_recording(tmp_path)
    corrupt(rec)
    refused_cleanly(import_args("vllm-record", rec, tmp_path), [tmp_path], *fragments)


def test_small_recording_imports(tmp_path):
    rec = small_recording(tmp_path)
    assert run_cli(*import_args("vllm-record", rec, tmp_path)).exit_code == 0


def test_unfinished_requests_of_a_killed_server_import(tmp_path):
    """The recorder writes requests in flight at shutdown as ``unfinished``
    with no first token or finish: a recording that says so imports."""
    rec = small_recording(tmp_path)
    head, *rows = (rec / "requests.csv").read_text().splitlines()
    cols = head.split(",")
    last = rows[-1].split(",")
    arrival = float(last[cols.index("arrival_s")]) + 0.001
    extra = dict(zip(cols, [""] * len(cols)), id="r9999", arrival_s=str(arrival), added_s=str(arrival),
                 prompt_tokens="50", output_tokens="0")
    rows = [r + ",finished_stopped" for r in rows] + [",".join(extra[c] for c in cols) + ",unfinished"]
    (rec / "requests.csv").write_text("\n".join([head + ",status", *rows]) + "\n")
    res = run_cli(*import_args("vllm-record", rec, tmp_path))
    assert res.exit_code == 0, res.output
    # the same row without the status is a missing value, refused
    (rec / "requests.csv").write_text("\n".join([head, *[r.rsplit(",", 1)[0] for r in rows]]) + "\n")
    refused_cleanly(["trace", "import", "vllm-record", rec, "--out", tmp_path / "again"], [tmp_path],
                    "requests.csv:", "missing")
