"""Property-based: random corruptions of a real recording (a
consistent prefix of d1) and of small CSVs of every public importer format.
Each corruption must be refused cleanly (tests/support/clean_refusal.py) with the
file and, where there is one, the row and column; a truncation the files
cannot tell from a whole recording must import (an oracle computed from the
raw files says which)."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import run_cli
from tests.refusals.test_bad_input_files import FORMATS, import_args, small_recording, write_csv
from tests.support.clean_refusal import refused_cleanly

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# values no count and no time may hold: JSON text as written into the line
BAD_JSON = ["9223372036854775808", "-1", "NaN", "Infinity", '"x"', "1e300", "null", "true", "[1]"]
BAD_COUNT_JSON = BAD_JSON + ["1.5"]
BAD_CELL = ["9223372036854775808", "9223372036854775807", "-1", "x", "1e300", "nan", "inf", "", "9" * 400]
BAD_COUNT_CELL = BAD_CELL + ["1.5"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return small_recording(tmp_path_factory.mktemp("pristine"))


def fresh(pristine: Path) -> Path:
    """A private copy of the recording in a new temporary directory."""
    root = Path(tempfile.mkdtemp(prefix="adv-"))
    shutil.copytree(pristine, root / "rec")
    return root


def refused(root: Path, *fragments: str) -> None:
    try:
        refused_cleanly(import_args("vllm-record", root / "rec", root), [root], *fragments)
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ------------------------------------------------------------- steps.jsonl
@SETTINGS
@given(data=st.data())
def test_truncated_steps_refused_unless_indistinguishable(pristine, data):
    lines = (pristine / "steps.jsonl").read_text().splitlines(keepends=True)
    k = data.draw(st.integers(1, len(lines) - 1), label="lines kept")
    root = fresh(pristine)
    (root / "rec" / "steps.jsonl").write_text("".join(lines[:k]))
    # oracle from the raw files: complete iff every request's first token
    # was scheduled in the kept steps and came by the end of the last one
    kept = [json.loads(x) for x in lines[:k]]
    seen = {it[0] for s in kept for it in s["items"]}
    _, *rows = (pristine / "requests.csv").read_text().splitlines()
    first = {r.split(",")[0]: float(r.split(",")[5]) for r in rows}
    complete = all(r in seen and t <= kept[-1]["end_s"] + 1e-6 for r, t in first.items())
    if complete:
        res = run_cli(*import_args("vllm-record", root / "rec", root))
        shutil.rmtree(root, ignore_errors=True)
        assert res.exit_code == 0, res.output
    else:
        refused(root, "requests.csv:", "incomplete recording")


@SETTINGS
@given(data=st.data())
def test_swapped_step_lines_refused(pristine, data):
    lines = (pristine / "steps.jsonl").read_text().splitlines(keepends=True)
    i = data.draw(st.integers(0, len(lines) - 2), label="i")
    j = data.draw(st.integers(i + 1, len(lines) - 1), label="j")
    lines[i], lines[j] = lines[j], lines[i]
    root = fresh(pristine)
    (root / "rec" / "steps.jsonl").write_text("".join(lines))
    refused(root, f"steps.jsonl:{i + 2}: step", "not increasing")


STEP_FIELDS = ["step", "start_s", "end_s", "item-tokens", "item-computed", "item-prompt"]


@SETTINGS
@given(data=st.data())
def test_bad_number_in_a_step_refused(pristine, data):
    lines = (pristine / "steps.jsonl").read_text().splitlines(keepends=True)
    n = data.draw(st.integers(0, len(lines) - 1), label="line")
    field = data.draw(st.sampled_from(STEP_FIELDS), label="field")
    is_count = field in ("step",) or field.startswith("item")
    value = data.draw(st.sampled_from(BAD_COUNT_JSON if is_count else BAD_JSON), label="value")
    rec = json.loads(lines[n])
    if field.startswith("item"):
        k = ["item-tokens", "item-computed", "item-prompt"].index(field) + 1
        item = data.draw(st.integers(0, len(rec["items"]) - 1), label="item")
        rec["items"][item][k] = "@@"
        column = "items"
    else:
        rec[field] = "@@"
        column = field
    lines[n] = json.dumps(rec).replace('"@@"', value) + "\n"
    root = fresh(pristine)
    (root / "rec" / "steps.jsonl").write_text("".join(lines))
    # a NaN/Infinity literal is named by the field that holds it; in an item, that is the line itself
    named = column if not (value in ("NaN", "Infinity") and column == "items") else "line"
    refused(root, f"steps.jsonl:{n + 1}: {named}")


# ------------------------------------------------------------- requests.csv
REQUIRED = ["id", "arrival_s", "added_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s", "ttft_s"]


@SETTINGS
@given(col=st.sampled_from(REQUIRED))
def test_deleted_request_column_refused(pristine, col):
    head, *rows = (pristine / "requests.csv").read_text().splitlines()
    i = head.split(",").index(col)
    cut = [",".join(c for k, c in enumerate(r.split(",")) if k != i) for r in [head, *rows]]
    root = fresh(pristine)
    (root / "rec" / "requests.csv").write_text("\n".join(cut) + "\n")
    refused(root, f"requests.csv:1: {col}: missing column")


@SETTINGS
@given(data=st.data())
def test_duplicated_request_row_refused(pristine, data):
    head, *rows = (pristine / "requests.csv").read_text().splitlines()
    i = data.draw(st.integers(0, len(rows) - 1), label="row")
    at = data.draw(st.integers(i + 1, len(rows)), label="copy at")
    rows.insert(at, rows[i])
    root = fresh(pristine)
    (root / "rec" / "requests.csv").write_text("\n".join([head, *rows]) + "\n")
    refused(root, f"requests.csv:{at + 2}: id: duplicate")


@SETTINGS
@given(data=st.data())
def test_bad_request_cell_refused(pristine, data):
    head, *rows = (pristine / "requests.csv").read_text().splitlines()
    col = data.draw(st.sampled_from(REQUIRED[1:]), label="column")
    value = data.draw(st.sampled_from(BAD_COUNT_CELL if col.endswith("_tokens") else BAD_CELL), label="value")
    r = data.draw(st.integers(0, len(rows) - 1), label="row")
    cells = rows[r].split(",")
    cells[head.split(",").index(col)] = value
    rows[r] = ",".join(cells)
    root = fresh(pristine)
    (root / "rec" / "requests.csv").write_text("\n".join([head, *rows]) + "\n")
    refused(root, f"requests.csv:{r + 2}: {col}")


# ------------------------------------------------ public importer formats
NUMERIC = {"azure": [1, 2], "burstgpt": [0, 2, 3], "lmbench": [1, 2, 3, 4, 5]}
COUNTS = {"azure": [1, 2], "burstgpt": [2, 3], "lmbench": [1, 2]}


@SETTINGS
@given(data=st.data())
def test_bad_cell_in_a_public_csv_refused(data):
    fmt = data.draw(st.sampled_from(sorted(FORMATS)), label="format")
    _, head, rows, _ = FORMATS[fmt]
    c = data.draw(st.sampled_from(NUMERIC[fmt]), label="column")
    value = data.draw(st.sampled_from(BAD_COUNT_CELL if c in COUNTS[fmt] else BAD_CELL), label="value")
    r = data.draw(st.integers(0, len(rows) - 1), label="row")
    cells = [row.split(",") for row in rows]
    cells[r][c] = value
    root = Path(tempfile.mkdtemp(prefix="adv-"))
    try:
        src = write_csv(root, fmt, None, [",".join(x) for x in cells])
        refused_cleanly(import_args(fmt, src, root), [root], f"{src.name}:{r + 2}: {head.split(',')[c]}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


@SETTINGS
@given(data=st.data())
def test_bad_header_in_a_public_csv_refused(data):
    fmt = data.draw(st.sampled_from(sorted(FORMATS)), label="format")
    _, head, rows, _ = FORMATS[fmt]
    names = head.split(",")
    c = data.draw(st.integers(0, len(names) - 1), label="column")
    how = data.draw(st.sampled_from(["rename", "duplicate", "drop"]), label="how")
    if how == "rename":
        new, body = [*names[:c], names[c] + "_x", *names[c + 1:]], rows
        why = (names[c], "missing column")
    elif how == "drop":
        new = names[:c] + names[c + 1:]
        body = [",".join(x for k, x in enumerate(r.split(",")) if k != c) for r in rows]
        why = (names[c], "missing column")
    else:
        new, body = [*names, names[c]], [r + "," + r.split(",")[c] for r in rows]
        why = (names[c], "duplicate column")
    root = Path(tempfile.mkdtemp(prefix="adv-"))
    try:
        src = write_csv(root, fmt, ",".join(new), body)
        refused_cleanly(import_args(fmt, src, root), [root], f"{src.name}:1: {why[0]}: {why[1]}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
