"""The vllm-bench importer keeps every inter-token latency (``itls_s``),
so a request-level trace says where each request's tokens fell."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd

from tests.conftest import run_cli, shared
from traces.store import open_trace

RUNS = shared("vllm_bench_serving_a100_per_request", "runs")


def test_importer_keeps_every_itl_and_refuses_a_negative_one(tmp_path):
    run = RUNS / "serving_meta-llama-Llama-3.3-70B-Instruct_tp8_pp1_sharegpt_qps_04__01_tp8_pp1.json"
    assert run_cli("trace", "import", "vllm-bench", run, "--out", tmp_path / "t").exit_code == 0
    reqs = open_trace(tmp_path / "t").read("requests")  # list<double> passes the store's checks
    assert pd.read_parquet(tmp_path / "t" / "requests.parquet").shape == reqs.shape
    doc = json.loads(run.read_text())
    sums = np.array([sum(x) for x in reqs["itls_s"]])
    assert np.allclose(reqs["arrival_s"] + reqs["ttft_s"] + sums, reqs["finish_s"])
    assert sorted(np.round(np.concatenate(reqs["itls_s"].to_list()), 9)) == sorted(
        np.round(np.concatenate([np.asarray(x, dtype=float) for x in doc["itls"]]), 9))
    doc["itls"][3] = [0.02, -0.01]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    res = run_cli("trace", "import", "vllm-bench", bad, "--out", tmp_path / "b")
    assert res.exit_code == 2 and "itls" in res.stderr and not (tmp_path / "b").exists()
