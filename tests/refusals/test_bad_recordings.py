"""Recordings at import: a vLLM recording whose files contradict
each other (requests against steps, engine.json's limits against the steps,
times against times) or hold a value of the wrong type is refused by
``trace import vllm-record`` with the first contradiction's file, row and
column, so nothing inconsistent reaches a kernel; the CSV readers refuse a
row with an extra field, an over-long line and a non-UTF-8 byte with its row.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_cli, shared
from tests.refusals.test_bad_input_files import small_recording
from tests.support.clean_refusal import refused_cleanly

CSV = "requests.csv"


def _rows(rec: Path) -> tuple[list[str], list[list[str]]]:
    header, *rows = (rec / CSV).read_text().splitlines()
    return header.split(","), [r.split(",") for r in rows]


def _put_rows(rec: Path, header: list[str], rows: list[list[str]]) -> None:
    (rec / CSV).write_text("\n".join([",".join(header), *(",".join(r) for r in rows)]) + "\n")


def set_cell(row: int, column: str, value: Callable[[list[str], dict], str]) -> Callable[[Path], None]:
    """Set requests.csv data row ``row`` (0-based) of ``column`` to value(row cells, column positions)."""
    def apply(rec: Path) -> None:
        header, rows = _rows(rec)
        pos = {c: i for i, c in enumerate(header)}
        rows[row][pos[column]] = value(rows[row], pos)
        _put_rows(rec, header, rows)
    return apply


def set_engine(**changes) -> Callable[[Path], None]:
    def apply(rec: Path) -> None:
        eng = json.loads((rec / "engine.json").read_text())
        eng.update(changes)
        (rec / "engine.json").write_text(json.dumps(eng))
    return apply


def _first_step_start(rec: Path, rid: str) -> float:
    for line in (rec / "steps.jsonl").read_text().splitlines():
        step = json.loads(line)
        if any(it[0] == rid for it in step["items"]):
            return step["start_s"]
    raise AssertionError(rid)


def _arrive_after_first_step(rec: Path) -> None:
    """The last request arrives after the step that first schedules it
    started (its first token, TTFT and sort order kept consistent)."""
    header, rows = _rows(rec)
    pos = {c: i for i, c in enumerate(header)}
    last = rows[-1]
    start = _first_step_start(rec, last[pos["id"]])
    arrival = start + 0.5 * (float(last[pos["first_token_s"]]) - start)
    last[pos["arrival_s"]] = repr(arrival)
    last[pos["ttft_s"]] = repr(float(last[pos["first_token_s"]]) - arrival)
    _put_rows(rec, header, rows)


def _edit_lines(rec: Path, name: str, fn) -> None:
    lines = (rec / name).read_text().splitlines()
    fn(lines)
    (rec / name).write_text("\n".join(lines) + "\n")


def _bump_computed_before(lines: list[str]) -> None:
    """A decode item whose computed_before skips a token."""
    for k, text in enumerate(lines[20:], start=20):
        step = json.loads(text)
        for it in step["items"]:
            if it[2] > it[3]:
                it[2] += 1
                lines[k] = json.dumps(step)
                return
    raise AssertionError("no decode item")


def _extra_field(rec: Path) -> None:
    text = (rec / CSV).read_text().splitlines()
    text[3] += ",surplus"
    (rec / CSV).write_text("\n".join(text) + "\n")


def _long_line(rec: Path) -> None:
    text = (rec / CSV).read_text().splitlines()
    text[2] = text[2] + "x" * (1 << 20)
    (rec / CSV).write_text("\n".join(text) + "\n")


def _latin1(name: str, line: int) -> Callable[[Path], None]:
    def apply(rec: Path) -> None:
        data = (rec / name).read_bytes().split(b"\n")
        data[line - 1] = data[line - 1].replace(b"0", b"\xe9", 1)
        (rec / name).write_bytes(b"\n".join(data))
    return apply


def _steps_dir(rec: Path) -> None:
    (rec / "steps.jsonl").unlink()
    (rec / "steps.jsonl").mkdir()


CASES = {
    # requests.csv against steps.jsonl
    "output_below_steps": (set_cell(0, "output_tokens", lambda r, p: "1"), [CSV, ":2:", "output_tokens", "steps.jsonl"]),
    "prompt_not_steps": (set_cell(1, "prompt_tokens", lambda r, p: str(int(r[p["prompt_tokens"]]) + 7)),
                         [CSV, ":3:", "prompt_tokens", "steps.jsonl"]),
    "arrival_after_schedule": (_arrive_after_first_step, [CSV, "arrival_s", "steps.jsonl"]),
    "finish_before_arrival": (set_cell(2, "finish_s", lambda r, p: repr(float(r[p["arrival_s"]]) / 2)),
                              [CSV, ":4:", "finish_s", "arrival_s"]),
    "finish_before_first_token": (set_cell(2, "finish_s", lambda r, p: repr(float(r[p["first_token_s"]]) - 1e-3)),
                                  [CSV, ":4:", "finish_s"]),
    "ttft_not_first_token": (set_cell(1, "ttft_s", lambda r, p: "0.5"), [CSV, ":3:", "ttft_s"]),
    "added_before_arrival": (set_cell(1, "added_s", lambda r, p: repr(float(r[p["arrival_s"]]) - 0.01)),
                             [CSV, ":3:", "added_s"]),
    # engine.json against steps.jsonl
    "max_model_len_below_steps": (set_engine(max_model_len=64), ["engine.json", "max_model_len", "steps.jsonl"]),
    "kv_blocks_below_steps": (set_engine(num_kv_blocks=1), ["engine.json", "num_kv_blocks", "steps.jsonl"]),
    "budget_below_steps": (set_engine(budget=64), ["engine.json", "max_num_batched_tokens", "steps.jsonl"]),
    "max_seqs_below_steps": (set_engine(max_seqs=1), ["engine.json", "max_num_seqs", "steps.jsonl"]),
    "max_seqs_above_budget": (set_engine(max_seqs=640), ["engine.json", "max_seqs", "budget"]),
    # engine.json types
    "prefix_caching_string": (set_engine(prefix_caching="false"), ["engine.json", "prefix_caching"]),
    "async_scheduling_number": (set_engine(async_scheduling=0), ["engine.json", "async_scheduling"]),
    "platform_list": (set_engine(platform=["cpu"]), ["engine.json", "platform"]),
    # a line deleted or a number edited in steps.jsonl
    "step_line_deleted": (lambda rec: _edit_lines(rec, "steps.jsonl", lambda ls: ls.pop(40)),
                          ["steps.jsonl:41:", "step", "missing"]),
    "computed_before_edited": (lambda rec: _edit_lines(rec, "steps.jsonl", _bump_computed_before),
                               ["steps.jsonl", "items", "computed_before"]),
    "finish_before_last_step": (set_cell(2, "finish_s", lambda r, p: r[p["first_token_s"]]), [CSV, ":4:", "finish_s"]),
    "request_row_deleted": (lambda rec: _edit_lines(rec, CSV, lambda ls: ls.pop(2)), [CSV, "steps.jsonl", "items"]),
    "engine_key_twice": (lambda rec: (rec / "engine.json").write_text('{"budget": 512, "budget": 8, ' +
                                                                      (rec / "engine.json").read_text()[1:]),
                         ["engine.json", "twice"]),
    # the files themselves
    "extra_field": (_extra_field, [CSV, ":4:", "row"]),
    "line_over_1mb": (_long_line, [CSV, ":3:", "line"]),
    "requests_latin1": (_latin1(CSV, 3), [CSV, ":3:", "encoding"]),
    "steps_latin1": (_latin1("steps.jsonl", 2), ["steps.jsonl:2:", "encoding"]),
    "steps_is_directory": (_steps_dir, ["steps.jsonl", "directory"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_inconsistent_recording_refused_at_import(tmp_path, case):
    rec = small_recording(tmp_path)
    corrupt, fragments = CASES[case]
    corrupt(rec)
    refused_cleanly(["trace", "import", "vllm-record", rec, "--out", tmp_path / "out"], [tmp_path], *fragments)


def test_small_recording_still_imports(tmp_path):
    """The corruptions above start from a recording that imports."""
    rec = small_recording(tmp_path)
    assert run_cli("trace", "import", "vllm-record", rec, "--out", tmp_path / "out").exit_code == 0


# ---------------------------------------------------- prefix-caching recordings (d8)
def _prefix_recording(tmp: Path) -> Path:
    src = shared("vllm_cpu", "d8_tinya_sessions_r0.3_pc")
    dst = tmp / "rec"
    dst.mkdir()
    for name in ("engine.json", CSV, "steps.jsonl"):
        shutil.copy(src / name, dst / name)
    return dst


PREFIX_CASES = {
    "more_hash_ids_than_blocks": (set_cell(0, "hash_ids", lambda r, p: r[p["hash_ids"]] + " 99 98 97"),
                                  [CSV, ":2:", "hash_ids"]),
    "cached_above_prompt": (set_cell(1, "cached_tokens", lambda r, p: str(int(r[p["prompt_tokens"]]) + 128)),
                            [CSV, ":3:", "cached_tokens"]),
    "cached_not_whole_blocks": (set_cell(1, "cached_tokens", lambda r, p: "5"), [CSV, ":3:", "cached_tokens"]),
    "cached_without_prefix_caching": (lambda rec: (set_engine(prefix_caching=False)(rec),
                                                   set_cell(1, "cached_tokens", lambda r, p: "128")(rec)),
                                      [CSV, ":3:", "cached_tokens", "prefix caching"]),
}


@pytest.mark.parametrize("case", sorted(PREFIX_CASES))
def test_prefix_cache_columns_refused_at_import(tmp_path, case):
    rec = _prefix_recording(tmp_path)
    corrupt, fragments = PREFIX_CASES[case]
    corrupt(rec)
    refused_cleanly(["trace", "import", "vllm-record", rec, "--out", tmp_path / "out"], [tmp_path], *fragments)
