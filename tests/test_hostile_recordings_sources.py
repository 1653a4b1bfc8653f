"""The other importers' sources: lmbench's runs.csv beside the
per-request file (refused when it lacks run_id, names the run twice or is
not UTF-8, instead of an internal error or silently dropped metadata), an
Azure row longer than 1 MB (traces.files.paths.LINE_MAX_BYTES), a row with a
field more than the header, a non-UTF-8 byte, a UTF-8 byte-order mark
(stripped: the file imports), and Mooncake hash ids beyond the input's blocks.
"""
from __future__ import annotations

import pytest

from tests.adversarial import refused_cleanly
from tests.conftest import run_cli
from tests.test_adversarial_inputs import AZURE_ROWS, LMB_ROWS, MOON_ROWS, import_args, moon, write_csv

RUNS_HEAD = "run_id,model,gpu"


@pytest.mark.parametrize("runs, fragments", [
    ("model,gpu\nllama,a100\n", ["runs.csv:1", "run_id", "missing"]),
    (RUNS_HEAD + "\nr1,llama,a100\nr1,qwen,h100\n", ["runs.csv:3", "run_id", "twice"]),
    (RUNS_HEAD + "\nr1,ll\xe9ma,a100\n", ["runs.csv:2", "encoding"]),
    (RUNS_HEAD + "\nr1,llama,a100,extra\n", ["runs.csv:2", "row"]),
], ids=["no-run_id", "run-twice", "latin1", "extra-field"])
def test_lmbench_runs_csv_refused(tmp_path, runs, fragments):
    src = write_csv(tmp_path, "lmbench")
    (src.parent / "runs.csv").write_bytes(runs.encode("latin-1"))
    refused_cleanly(import_args("lmbench", src, tmp_path), [tmp_path], *fragments)


def test_lmbench_runs_csv_read(tmp_path):
    src = write_csv(tmp_path, "lmbench")
    (src.parent / "runs.csv").write_text(RUNS_HEAD + "\nr0,other,x\nr1,llama,a100\n")
    assert run_cli(*import_args("lmbench", src, tmp_path)).exit_code == 0
    import json
    meta = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert meta["source"]["model"] == "llama" and meta["source"]["gpu"] == "a100"


@pytest.mark.parametrize("fmt, rows, fragments", [
    ("azure", [AZURE_ROWS[0], AZURE_ROWS[1] + "0" * (10 << 20), AZURE_ROWS[2]], ["az_conv.csv:3", "line", "1048576"]),
    ("azure", [AZURE_ROWS[0], AZURE_ROWS[1] + ",7", AZURE_ROWS[2]], ["az_conv.csv:3", "row"]),
    ("lmbench", [LMB_ROWS[0], LMB_ROWS[1] + ",0.2", LMB_ROWS[2]], ["per_request.csv:3", "row"]),
], ids=["azure-10mb-row", "azure-extra-field", "lmbench-extra-field"])
def test_csv_rows_refused(tmp_path, fmt, rows, fragments):
    src = write_csv(tmp_path, fmt, rows=rows)
    refused_cleanly(import_args(fmt, src, tmp_path), [tmp_path], *fragments)


def test_azure_latin1_refused_and_bom_stripped(tmp_path):
    src = write_csv(tmp_path, "azure")
    data = src.read_bytes().split(b"\n")
    data[2] = data[2].replace(b"-", b"\xe9", 1)
    src.write_bytes(b"\n".join(data))
    refused_cleanly(import_args("azure", src, tmp_path), [tmp_path], "az_conv.csv:3", "encoding")
    src = write_csv(tmp_path, "azure")
    src.write_bytes(b"\xef\xbb\xbf" + src.read_bytes())
    assert run_cli(*import_args("azure", src, tmp_path)).exit_code == 0


def test_mooncake_more_hash_ids_than_blocks(tmp_path):
    rows = [dict(r) for r in MOON_ROWS]
    rows[2]["hash_ids"] = [4, 5, 6]  # 100 tokens: one block of 512
    refused_cleanly(import_args("mooncake", moon(tmp_path, rows), tmp_path), [tmp_path], "mooncake.jsonl:3", "hash_ids")
