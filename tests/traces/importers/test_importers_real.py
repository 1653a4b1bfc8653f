"""Importers on the real public files under ../shared/data (Azure, Mooncake,
``vllm bench serve`` results, LMBench, vLLM recordings), each skipped when
its file is absent, and the empty-file refusal of every importer (split from
test_importers.py, which keeps the small fixtures and the bad-input cases).
"""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import assert_refused, run_cli, shared
from tests.traces.importers.test_importers import do_import, write
from traces.importers import IMPORTERS
from traces.store import open_trace

# --------------------------------------------------------------- real files


@pytest.mark.parametrize("name,rows,first,second_arrival", [
    ("AzureLLMInferenceTrace_conv.csv", 19_366, (374, 44), 4.314579),
    ("AzureLLMInferenceTrace_code.csv", 8_819, (4808, 10), 0.052),
])
def test_real_azure(tmp_path, name, rows, first, second_arrival):
    src = shared("azure_llm_2023", name)
    res, r = do_import("azure", src, tmp_path / "t")
    assert res.exit_code == 0, res.output
    assert len(r) == rows
    assert (r["prompt_tokens"].iloc[0], r["output_tokens"].iloc[0]) == first
    assert abs(r["arrival_s"].iloc[1] - second_arrival) < 1e-6
    src_df = pd.read_csv(src)
    assert r["prompt_tokens"].sum() == src_df["ContextTokens"].sum()
    assert r["output_tokens"].sum() == src_df["GeneratedTokens"].sum()


@pytest.mark.parametrize("name,rows", [("conversation_trace.jsonl", 12_031), ("synthetic_trace.jsonl", 3_993)])
def test_real_mooncake(tmp_path, name, rows):
    res, r = do_import("mooncake", shared("mooncake", name), tmp_path / "t")
    assert res.exit_code == 0, res.output
    assert len(r) == rows
    if name.startswith("conversation"):
        assert r[["prompt_tokens", "output_tokens"]].iloc[0].tolist() == [6758, 500]
        assert list(r["hash_ids"].iloc[0])[:3] == [0, 1, 2]
        assert 3400 < r["arrival_s"].max() < 3600


def test_real_vllm_bench_runs(tmp_path):
    runs = sorted(shared("vllm_bench_serving_a100_per_request", "runs").glob("*.json"))
    per_req = pd.read_csv(shared("vllm_bench_serving_a100_per_request", "per_request.csv"))
    summary = pd.read_csv(shared("vllm_bench_serving_a100_per_request", "runs_summary.csv"))
    assert len(runs) == 24
    for i, path in enumerate(runs):
        res, r = do_import("vllm-bench", path, tmp_path / f"t{i}")
        assert res.exit_code == 0, res.output
        run_id = summary.loc[summary["file"] == f"runs/{path.name}", "run_id"].item()
        ref = per_req[per_req["run_id"] == run_id].sort_values("req_idx")
        assert len(r) == len(ref) == 200
        assert np.allclose(r["arrival_s"], ref["recon_arrival_s"], atol=2e-6)
        assert np.allclose(r["ttft_s"], ref["ttft_s"], atol=2e-6)
        assert (r["prompt_tokens"].to_numpy() == ref["input_len"].to_numpy()).all()


def test_real_lmbench_runs(tmp_path):
    src = shared("llmd_lmbench_per_request", "per_request.csv")
    runs = pd.read_csv(shared("llmd_lmbench_per_request", "runs.csv"))
    per_req = pd.read_csv(src)
    for run_id in ("r000", "r250", "r500"):  # r000 ran with LMCache: accepted, not modelled
        res, r = do_import("lmbench", src, tmp_path / run_id, "--run", run_id,
                           *(["--accept-unmodelled", "lmcache"] if run_id == "r000" else []))
        assert res.exit_code == 0, res.output
        n = int(runs.loc[runs["run_id"] == run_id, "n_requests"].item())
        ref = per_req[per_req["run_id"] == run_id]
        assert len(r) == n == len(ref)
        assert r["arrival_s"].is_monotonic_increasing and r["arrival_s"].iloc[0] == 0
        assert sorted(r["ttft_s"].round(6)) == sorted(ref["ttft_s"].round(6))
        meta = open_trace(tmp_path / run_id).meta["source"]
        assert meta["run"] == run_id and meta["model"] == runs.loc[runs["run_id"] == run_id, "model"].item()


def test_real_vllm_recordings(tmp_path):
    root = shared("vllm_cpu")
    recs = sorted(p for p in root.iterdir() if p.is_dir())
    assert {f"d{i}" for i in range(1, 11)} <= {p.name.split("_")[0] for p in recs}
    for rec in recs:
        res = run_cli("trace", "import", "vllm-record", rec, "--out", tmp_path / rec.name)
        assert res.exit_code == 0, res.output
        t = open_trace(tmp_path / rec.name)
        src_req = pd.read_csv(rec / "requests.csv")
        src_steps = [json.loads(x) for x in (rec / "steps.jsonl").read_text().splitlines()]
        assert t.meta["tables"]["requests"] == len(src_req)
        assert t.meta["tables"]["steps"] == len(src_steps)
        assert t.meta["tables"]["step_items"] == sum(len(s["items"]) for s in src_steps)
        assert t.meta["tables"]["preemptions"] == sum(len(s["preempted"]) for s in src_steps)
        steps = t.read("steps")
        assert steps["prefill_tokens"].sum() + steps["decode_tokens"].sum() == sum(
            it[1] for s in src_steps for it in s["items"])
        r = t.read("requests")
        assert np.allclose(r["ttft_s"], src_req["ttft_s"])
        engine = json.loads((rec / "engine.json").read_text())
        assert t.read("instances")["num_kv_blocks"].item() == engine["num_kv_blocks"]
        assert t.read("instances")["prefix_caching"].item() == engine.get("prefix_caching", False)
        if engine.get("prefix_caching", False):  # d8-d10: the prompt's full blocks and the recorded hit
            assert t.meta["hash_block_tokens"] == engine["block_size"]
            ids = [[int(x) for x in str(c).split()] if isinstance(c, str) else [] for c in src_req["hash_ids"]]
            assert [list(h) for h in r["hash_ids"]] == ids
            assert all(len(h) == p // engine["block_size"] for h, p in zip(ids, src_req["prompt_tokens"]))
            assert r["cached_tokens"].tolist() == src_req["cached_tokens"].tolist()
            assert 0.5 < r["cached_tokens"].sum() / r["prompt_tokens"].sum() < 0.8
        else:
            assert "hash_ids" not in r and "hash_block_tokens" not in t.meta
    assert open_trace(tmp_path / "d7_tinya_kv36_r4").meta["tables"]["preemptions"] == 10


@pytest.mark.parametrize("fmt", [f for f in IMPORTERS if f != "vllm-record"])
def test_every_importer_refuses_an_empty_file(tmp_path, fmt):
    src = write(tmp_path, "empty.src", "")
    assert_refused(run_cli("trace", "import", fmt, src, "--out", tmp_path / "o", "--run", "r0"), tmp_path / "o",
                   "empty.src", "empty")
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "engine.json").write_text("")
    assert_refused(run_cli("trace", "import", "vllm-record", tmp_path / "rec", "--out", tmp_path / "o"),
                   tmp_path / "o", "engine.json", "empty")
