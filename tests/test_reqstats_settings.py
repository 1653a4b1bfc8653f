"""``trace import vllm-reqstats`` checks the engine settings at import, as the vllm-record importer
does: types of meta.json's sections, each setting's range, and consistency with the logged requests
(a ``max_model_len`` at or below a prompt, a KV pool that cannot hold the largest request, a budget
below ``max_num_seqs`` or, without chunked prefill, below ``max_model_len``). Each refusal names the
file and key (or ``--engine``), exit 2, nothing written."""
from __future__ import annotations

import pytest

from tests.conftest import assert_refused, run_cli
from tests.test_reqstats_import import _request, _run
from traces.store import open_trace


def _import(tmp_path, *engine: str, requests=None, meta=None):
    src = _run(tmp_path, requests, meta)
    out = tmp_path / "t"
    args = [a for e in engine for a in ("--engine", e)]
    return run_cli("trace", "import", "vllm-reqstats", src, "--out", out, *args), out


def test_a_twenty_digit_request_id_numbers_the_requests_in_file_order(tmp_path):
    reqs = [_request(i, 0.5 * i) for i in range(3)]
    reqs[1]["request_id"] = "bench-" + "9" * 21  # no int64 holds it: once an internal OverflowError
    res, out = _import(tmp_path, requests=reqs)
    assert res.exit_code == 0, res.output
    assert open_trace(out).read("requests")["request_id"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("kwargs", [[1], "x", 5, True])
def test_engine_kwargs_that_is_no_object_is_refused_by_name(tmp_path, kwargs):
    res, out = _import(tmp_path, meta={"engine_kwargs": kwargs})
    assert_refused(res, out, "meta.json: engine_kwargs: must be a JSON object")


def test_engine_kwargs_null_means_not_saved(tmp_path):
    res, out = _import(tmp_path, meta={"engine_kwargs": None})
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize("seqs", [-5, 10**15, 1e300, 0, "8"])
def test_max_num_seqs_out_of_range_is_refused(tmp_path, seqs):
    res, out = _import(tmp_path, meta={"engine_kwargs": {"max_num_seqs": seqs}})
    assert_refused(res, out, "meta.json: engine_kwargs.max_num_seqs: must be a whole number in [1, 2147483647]")


@pytest.mark.parametrize("seqs", [-5, 10**15, 1e300])
def test_a_kv_size_bounded_by_max_num_seqs_takes_the_checked_setting(tmp_path, seqs):
    """A run whose usage never shows its KV size gets max_num_seqs x its longest request, which
    never binds. engine_kwargs.max_num_seqs beside the resolved config's went into it unchecked:
    -5 made -40 blocks, 1e300 a 303-digit size, exit 0. The product is of the setting in force."""
    series = "t,prompt_throughput,gen_throughput,running,waiting,kv_cache_pct\n1.0,300.0,20.0,2,1,0\n"
    meta = {"resolved_config": {"scheduler_config": {"max_num_seqs": 8}}, "engine_kwargs": {"max_num_seqs": seqs}}
    out = tmp_path / "t"
    res = run_cli("trace", "import", "vllm-reqstats", _run(tmp_path, meta=meta, series=series), "--out", out)
    assert res.exit_code == 0, res.output
    settings = open_trace(out).meta["engine"]["settings"]
    assert (settings["max_num_seqs"], settings["num_kv_blocks"]) == (8, 8 * 8)  # 8 x 116 tokens in blocks of 16


def test_max_model_len_below_a_logged_prompt_is_refused_at_import(tmp_path):
    res, out = _import(tmp_path, meta={"engine_kwargs": {"max_model_len": 5}})
    assert_refused(res, out, "meta.json: engine_kwargs.max_model_len: 5", "longest logged prompt (105 tokens)")


def test_a_kv_pool_that_cannot_hold_the_largest_request_is_refused_naming_engine(tmp_path):
    res, out = _import(tmp_path, "num_kv_blocks=2")
    assert_refused(res, out, "error: --engine: num_kv_blocks=2:", "largest logged request (116 tokens, 8 blocks)")
    (tmp_path / "ok").mkdir()
    res, out = _import(tmp_path / "ok", "num_kv_blocks=8")
    assert res.exit_code == 0, res.output  # 8 blocks of 16 hold 116 tokens: the bound is exact


def test_a_budget_below_max_num_seqs_is_refused(tmp_path):
    res, out = _import(tmp_path, "max_num_batched_tokens=1")
    assert_refused(res, out, "error: --engine: max_num_batched_tokens=1:", "below max_num_seqs 8")
    (tmp_path / "f").mkdir()
    res, out = _import(tmp_path / "f", meta={"engine_kwargs": {"max_num_seqs": 1024, "max_num_batched_tokens": 512}})
    assert_refused(res, out, "meta.json: engine_kwargs.max_num_batched_tokens: 512", "below max_num_seqs 1024")


def test_no_chunked_prefill_with_a_budget_below_the_context_is_refused(tmp_path):
    res, out = _import(tmp_path, "chunked_prefill=false")
    assert_refused(res, out, "error: --engine: chunked_prefill=false:", "at least max_model_len (131072)")
    (tmp_path / "ok").mkdir()
    res, out = _import(tmp_path / "ok", "chunked_prefill=false", "max_model_len=512")
    assert res.exit_code == 0, res.output  # budget 512 >= max_model_len 512: what vLLM accepts
