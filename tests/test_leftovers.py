"""Refusals and behaviours a hostile tester found missing: demo onto another latroute output,
Azure CSVs with bare-CR line ends, the modes of a finished recording, a trace's meta.json
``engine`` that is no object, ``trace info`` on a bad engine series, studies run as modules."""
from __future__ import annotations

import os
import stat

import pytest

from tests.conftest import assert_refused, run_cli
from traces.store import open_trace


def test_demo_refuses_another_latroute_output_before_any_work(tmp_path):
    out = tmp_path / "t"
    assert run_cli("trace", "generate", "--requests", "20", "--rate", "4", "--out", out).exit_code == 0
    before = sorted(p.name for p in out.iterdir())
    res = run_cli("demo", "--out", out)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"error: --out: {out} holds a latroute output, not an earlier demo's: pass --force to "
                     "replace it"], lines
    assert "[1/6]" not in res.output  # refused before any work
    assert sorted(p.name for p in out.iterdir()) == before and open_trace(out).read("requests").shape[0] == 20


@pytest.mark.parametrize("end", ["\r", "\n", "\r\n"])
def test_azure_csv_imports_with_any_line_end(tmp_path, end):
    src = tmp_path / "AzureLLMInferenceTrace_code.csv"
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:46.6805900,374,44",
            "2023-11-16 18:15:50.9951690,396,109"]
    src.write_bytes(end.join(rows).encode() + end.encode())
    res = run_cli("trace", "import", "azure", src, "--out", tmp_path / "t")
    assert res.exit_code == 0, res.output
    r = open_trace(tmp_path / "t").read("requests")
    assert r["prompt_tokens"].tolist() == [374, 396] and r["arrival_s"].tolist() == pytest.approx([0.0, 4.314579])


def test_azure_csv_with_bare_cr_reports_the_bad_row_by_line(tmp_path):
    src = tmp_path / "a.csv"
    src.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\r2023-11-16 18:15:46,374,44\r2023-11-16 18:15:50,x,9\r")
    out = tmp_path / "t"
    assert_refused(run_cli("trace", "import", "azure", src, "--out", out), out, "a.csv:3: ContextTokens")


@pytest.mark.parametrize("mask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_record_finish_gives_the_joined_files_the_umasks_modes(tmp_path, mask, mode):
    from tests.test_fuzz_live import finish_inputs

    (tmp_path / "src").mkdir()
    rec = finish_inputs(tmp_path)
    old = os.umask(mask)
    try:
        res = run_cli("record", "finish", rec)
    finally:
        os.umask(old)
    assert res.exit_code == 0, res.output
    for name in ("steps.jsonl", "requests.csv"):
        assert stat.S_IMODE(os.stat(rec / name).st_mode) == mode, name
