"""The workload generator: paper defaults, determinism and reuse of real traces."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_cli
from traces.policies.tasks import QWEN3_MODELS, TASKS, parse_mix
from traces.store import open_trace
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload


@pytest.fixture(scope="module")
def big():
    return generate_workload(WorkloadConfig(requests=60_000, arrivals=ArrivalSpec("poisson", 8.0), seed=5))


def test_task_mix_lengths_and_slo(big):
    r = big.requests
    share = r["task"].value_counts(normalize=True)
    assert set(share.index) == set(TASKS)
    assert (share - 0.25).abs().max() < 0.01
    med = r.groupby("task")[["prompt_tokens", "output_tokens"]].median()
    for name, spec in TASKS.items():
        assert abs(med.loc[name, "prompt_tokens"] / spec.prompt_median - 1) < 0.05
        assert abs(med.loc[name, "output_tokens"] / spec.output_median - 1) < 0.05
    base = 0.155 + 0.035e-3 * r["prompt_tokens"]
    tau = r["slo_ttft_s"]
    assert tau.between(0.150, 1.120).all()
    inner = (base * 0.98 > 0.150) & (base * 1.02 < 1.120)
    assert ((tau[inner] / base[inner]).between(0.98, 1.02)).all()
    assert (tau[base * 1.02 < 0.150] == 0.150).all()
    assert (tau[base * 0.98 > 1.120] == 1.120).all()


def test_predicted_lengths_and_accuracy_noise(big):
    r, q = big.requests, big.quality
    mae_len = (r["predicted_output_tokens"] - r["output_tokens"]).abs().mean()
    assert 185 < mae_len < 215
    assert (r["predicted_output_tokens"] >= 1).all()
    assert len(q) == len(r) * len(QWEN3_MODELS)
    mae_acc = (q["acc"] - q["acc_hat"]).abs().mean()
    assert 0.155 < mae_acc < 0.185
    assert q["acc"].between(0, 1).all() and q["acc_hat"].between(0, 1).all()
    merged = q.merge(r[["request_id", "task"]], on="request_id")
    means = merged.groupby(["task", "model"])["acc"].mean()
    for name, spec in TASKS.items():
        for m, model in enumerate(QWEN3_MODELS):
            assert abs(means[(name, model)] - spec.accuracy[m]) < 0.02


def test_same_arguments_give_identical_bytes(tmp_path):
    args = ["trace", "generate", "--requests", 3000, "--rate", 6, "--arrival", "mmpp", "--burst-ratio", 6, "--seed", 11]
    for d in ("a", "b"):
        res = run_cli(*args, "--out", tmp_path / d)
        assert res.exit_code == 0, res.output
    for table in ("requests", "quality"):
        assert (tmp_path / "a" / f"{table}.parquet").read_bytes() == (tmp_path / "b" / f"{table}.parquet").read_bytes()
    res = run_cli(*args[:-1], 12, "--out", tmp_path / "c")
    assert (tmp_path / "a" / "requests.parquet").read_bytes() != (tmp_path / "c" / "requests.parquet").read_bytes()


def test_mix_change_keeps_arrivals():
    a = generate_workload(WorkloadConfig(requests=500, seed=3))
    b = generate_workload(WorkloadConfig(requests=500, seed=3, mix=parse_mix("alpaca=1")))
    assert np.array_equal(a.requests["arrival_s"], b.requests["arrival_s"])
    assert set(b.requests["task"]) == {"alpaca"}


def test_duration_and_meta(tmp_path):
    res = run_cli("trace", "generate", "--duration", 100, "--rate", 4, "--arrival", "gamma", "--burstiness", 0.5,
                  "--out", tmp_path / "g")
    assert res.exit_code == 0, res.output
    t = open_trace(tmp_path / "g")
    r = t.read("requests")
    assert r["arrival_s"].max() < 100 and 300 < len(r) < 500
    assert t.meta["generator"]["arrivals"]["kind"] == "gamma"
    assert t.meta["generator"]["arrivals"]["burstiness"] == 0.5
    assert t.meta["tables"] == {"quality": 3 * len(r), "requests": len(r)}


def test_lengths_and_arrivals_from_another_trace(tmp_path):
    src = tmp_path / "src"
    assert run_cli("trace", "generate", "--requests", 400, "--rate", 2, "--mix", "govreport=1", "--out", src).exit_code == 0
    srcr = open_trace(src).read("requests")
    res = run_cli("trace", "generate", "--requests", 300, "--arrivals-from", src, "--lengths-from", src,
                  "--mix", "alpaca=1", "--out", tmp_path / "re")
    assert res.exit_code == 0, res.output
    r = open_trace(tmp_path / "re").read("requests")
    assert np.allclose(r["arrival_s"], srcr["arrival_s"][:300] - srcr["arrival_s"][0])
    pairs = set(zip(srcr["prompt_tokens"], srcr["output_tokens"]))
    assert all(p in pairs for p in zip(r["prompt_tokens"], r["output_tokens"]))
    # the lengths are the source's (govreport), so is the label; not --mix's alpaca
    assert (r["task"] == "govreport").all()
    assert open_trace(tmp_path / "re").meta["generator"]["policies"]["quality"] == "model (one task)"
    # with --rate the reused arrivals are rescaled to that mean rate
    res = run_cli("trace", "generate", "--arrivals-from", src, "--rate", 8, "--out", tmp_path / "fast")
    assert res.exit_code == 0, res.output
    f = open_trace(tmp_path / "fast").read("requests")["arrival_s"].to_numpy()
    assert len(f) == 400 and abs((len(f) - 1) / f[-1] - 8) < 1e-9
    res = run_cli("trace", "generate", "--arrivals-from", src, "--requests", 401, "--out", tmp_path / "x")
    assert res.exit_code == 2 and "only 400 arrivals" in res.output


def test_lengths_from_a_trace_without_tasks_are_labelled_with_its_name(tmp_path):
    """Lengths from an imported trace were labelled with the
    paper's tasks (and given those tasks' accuracies); they carry the
    source's name and the one-task accuracy model instead."""
    from traces.store import TraceWriter

    rng = np.random.default_rng(1)
    with TraceWriter(tmp_path / "azlike") as w:
        w.meta["source"] = {"kind": "test"}
        w.write_table("requests", pd.DataFrame({
            "request_id": np.arange(50), "arrival_s": np.sort(rng.uniform(0, 10, 50)),
            "prompt_tokens": rng.integers(10, 3000, 50), "output_tokens": rng.integers(1, 500, 50)}))
    res = run_cli("trace", "generate", "--requests", 2000, "--rate", 4, "--lengths-from", tmp_path / "azlike",
                  "--seed", 3, "--out", tmp_path / "g")
    assert res.exit_code == 0, res.output
    t = open_trace(tmp_path / "g")
    r = t.read("requests")
    assert set(r["task"]) == {"azlike"}
    assert t.meta["generator"]["policies"] == {"task": "the source's task, else its name", "slo": "rule",
                                               "quality": "model (one task)"}


def test_generate_usage_errors(tmp_path):
    for args in (["--rate", 3], ["--requests", 10], ["--requests", 10, "--duration", 5, "--rate", 1],
                 ["--requests", 10, "--rate", 1, "--mix", "alpaca=1,nosuchtask=1"],
                 ["--requests", 10, "--rate", -1]):
        res = run_cli("trace", "generate", "--out", tmp_path / "o", *args)
        assert res.exit_code == 2, (args, res.output)
        assert not (tmp_path / "o").exists()
