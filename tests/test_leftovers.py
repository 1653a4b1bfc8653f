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


@pytest.fixture(scope="module")
def reqstats_trace(tmp_path_factory):
    from tests.test_reqstats_import import _run

    root = tmp_path_factory.mktemp("rs")
    assert run_cli("trace", "import", "vllm-reqstats", _run(root), "--out", root / "good").exit_code == 0
    return root / "good"


def _edited(trace, dst, settings: dict):
    import json
    import shutil

    shutil.copytree(trace, dst)
    meta = json.loads((dst / "meta.json").read_text())
    meta["engine"]["settings"].update(settings)
    meta["engine"].setdefault("marks", {}).update({k: "given" for k in settings})  # older imports wrote none
    (dst / "meta.json").write_text(json.dumps(meta))
    return dst


@pytest.mark.parametrize("settings,key,frag", [
    ({"num_kv_blocks": 2}, "num_kv_blocks", "cannot hold 6 of 6 requests"),
    ({"max_model_len": 5}, "max_model_len", "rejects 6 of 6 requests"),
    ({"max_num_batched_tokens": 1}, "max_num_batched_tokens", "must be >= max_num_seqs"),
    ({"chunked_prefill": False}, "max_num_batched_tokens", "without chunked prefill")])
@pytest.mark.parametrize("cmd", ["validate", "calibrate"])
def test_a_traces_own_engine_is_blamed_on_its_meta_json(reqstats_trace, tmp_path, settings, key, frag, cmd):
    """A trace imported before the import checked its engine (or edited since): the refusal names the
    trace's meta.json and key, not --engine, which the user did not give (nor an internal ValueError)."""
    t = _edited(reqstats_trace, tmp_path / "t", settings)
    out = tmp_path / ("v" if cmd == "validate" else "p.json")
    args = (["validate", t, "--profile", "qwen3-8b-h100"] if cmd == "validate" else
            ["calibrate", "--from-requests", t])
    assert_refused(run_cli(*args, "--out", out), out, f"error: {t / 'meta.json'}: engine.settings.{key}:", frag)


def test_an_engine_option_is_still_blamed_on_engine(reqstats_trace, tmp_path):
    out = tmp_path / "v"
    assert_refused(run_cli("validate", reqstats_trace, "--profile", "qwen3-8b-h100", "--engine", "num_kv_blocks=2",
                           "--out", out), out, "error: --engine: num_kv_blocks=2")


@pytest.mark.parametrize("column,row,value,frag", [("kv_cache_pct", 1, float("nan"), "missing or non-numeric"),
                                                   ("running", 2, -2, "negative")])
def test_trace_info_says_an_engine_series_is_invalid(reqstats_trace, tmp_path, column, row, value, frag):
    import json
    import shutil

    import pandas as pd

    t = tmp_path / "t"
    shutil.copytree(reqstats_trace, t)
    f = t / "engine_series.parquet"
    df = pd.read_parquet(f)
    df.loc[row, column] = value
    df.to_parquet(f)
    res = run_cli("trace", "info", t)
    assert res.exit_code == 0, res.output
    line = f"INVALID engine_series: {f}:{row + 1}: {column}: "
    assert any(ln.startswith(line) and frag in ln for ln in res.output.splitlines()), res.output
    doc = json.loads(run_cli("trace", "info", t, "--json").output)
    assert doc["invalid"]["engine_series"].startswith(f"{f}:{row + 1}: {column}: ")
    assert "INVALID" not in run_cli("trace", "info", reqstats_trace).output


def test_a_meta_json_engine_that_is_a_string_is_refused_by_name(reqstats_trace, tmp_path):
    import json
    import shutil

    t = tmp_path / "t"
    shutil.copytree(reqstats_trace, t)
    meta = json.loads((t / "meta.json").read_text())
    meta["engine"] = "fast"
    (t / "meta.json").write_text(json.dumps(meta))
    for args in (["validate", t, "--profile", "qwen3-8b-h100", "--out", tmp_path / "v"],
                 ["calibrate", "--from-requests", t, "--out", tmp_path / "p.json"]):
        assert_refused(run_cli(*args), args[-1], f"error: {t / 'meta.json'}: engine: must be a JSON object")


@pytest.mark.parametrize("key,value", [("engine_kwargs", [1]), ("engine_kwargs", "x"), ("hardware", 5)])
def test_a_stored_sources_sections_must_be_objects(reqstats_trace, tmp_path, key, value):
    """A trace whose meta.json ``source.engine_kwargs`` is a list failed in calibrate as an internal
    AttributeError (the weight floor reads it): refused by name when the trace is opened."""
    import json
    import shutil

    t = tmp_path / "t"
    shutil.copytree(reqstats_trace, t)
    meta = json.loads((t / "meta.json").read_text())
    meta["source"][key] = value
    (t / "meta.json").write_text(json.dumps(meta))
    out = tmp_path / "p.json"
    assert_refused(run_cli("calibrate", "--from-requests", t, "--out", out), out,
                   f"error: {t / 'meta.json'}: source.{key}: must be a JSON object")
