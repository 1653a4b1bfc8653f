"""The engine twin: timing rules, determinism, noise, policies and the
tables it writes."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from estimators.engine.config import InstanceConfig
from estimators.timemodel.fit import NoiseModel
from estimators.timemodel.profile import BatchTimeProfile, load_profile
from harness.twin.pools.spec import load_pool
from harness.twin.simulation import (
    InstanceSpec,
    Twin,
    TwinConfig,
    fixed_router,
    shortest_queue_router,
)
from tests.conftest import run_cli, shared
from traces.store import TraceWriter, open_trace
from traces.workload.generator import WorkloadConfig, generate_workload


def toy_profile(gap=0.0, noise=None) -> BatchTimeProfile:
    # eq9: 10 ms per step + 10 us per token (+ small attention terms)
    return BatchTimeProfile("toy", "eq9", np.array([0.01, 1e-5, 1e-8, 1e-9]), noise or NoiseModel(), step_gap_s=gap)


def toy_twin(policy="vllm-v1", gap=0.0, noise=None, noise_on=False, seed=0, n=1, **engine):
    eng = dict(policy=policy, **{"max_num_batched_tokens": 2048, "max_num_seqs": 64, "block_size": 16,
                                         "num_kv_blocks": 10_000, "chunked_prefill": policy != "vllm-v0",
                                         "max_model_len": 32768, **engine})
    specs = [InstanceSpec(InstanceConfig(instance_id=f"i{k}", **eng), toy_profile(gap, noise)) for k in range(n)]
    return Twin(specs, TwinConfig(seed=seed, noise=noise_on))


def reqs(arrivals, prompts, outputs):
    return pd.DataFrame({"request_id": np.arange(len(arrivals)), "arrival_s": np.asarray(arrivals, float),
                         "prompt_tokens": prompts, "output_tokens": outputs})


def test_lone_request_ttft_is_the_sum_of_its_prefill_steps():
    prof = toy_profile(gap=0.001)
    res = toy_twin(gap=0.001).run(reqs([1.0], [5000], [3]), fixed_router(np.array([0])))
    # chunks 2048, 2048, 904 from scratch; each step starts a gap after the previous boundary
    def t(p, c):
        return prof.coefficients @ [1, p, 0, p * c + p * (p + 1) / 2] * prof.expected_multiplier
    expect = 3 * 0.001 + t(2048, 0) + t(2048, 2048) + t(904, 4096)
    assert res.requests["ttft_s"].iloc[0] == pytest.approx(expect, rel=1e-12)
    steps = res.steps
    assert len(steps) == 5 and steps["prefill_tokens"].tolist()[:3] == [2048, 2048, 904]
    assert np.allclose(steps["start_s"].to_numpy()[1:] - steps["end_s"].to_numpy()[:-1], 0.001)
    assert res.requests["finish_s"].iloc[0] == pytest.approx(steps["end_s"].iloc[-1])


def test_arrivals_join_at_the_next_step_boundary():
    w = generate_workload(WorkloadConfig(requests=300, seed=1)).requests
    w["arrival_s"] = np.sort(np.random.default_rng(0).uniform(0, 20, len(w)))
    res = toy_twin(gap=0.0005).run(w, fixed_router(np.zeros(len(w), dtype=int)))
    items = res.step_items.merge(res.steps[["step", "start_s"]], on="step")
    first = items.groupby("request_id")["start_s"].min()
    arr = w.set_index("request_id")["arrival_s"]
    assert (first >= arr.loc[first.index]).all()
    # never later than the first step that started after the arrival
    starts = res.steps["start_s"].to_numpy()
    nxt = starts[np.searchsorted(starts, arr.loc[first.index].to_numpy(), side="left")]
    assert (first.to_numpy() >= nxt - 1e-12).all()


def test_noise_off_charges_expected_times_exactly_and_is_deterministic():
    w = generate_workload(WorkloadConfig(requests=400, seed=2)).requests
    w["arrival_s"] = w["arrival_s"] / 4
    pool = load_pool("qwen3-h100")
    a = Twin.from_pool(pool, TwinConfig(noise=False)).run(w, shortest_queue_router)
    for inst, steps in a.steps.groupby("instance_id"):
        prof = load_profile(f"{inst}-h100")
        assert np.allclose(steps["end_s"] - steps["start_s"], prof.expected(steps), rtol=1e-12, atol=0)
    b = Twin.from_pool(pool, TwinConfig(noise=False)).run(w, shortest_queue_router)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    assert (a.requests["ttft_s"] >= 0.005).all()  # the front-end overhead of the pool


def test_noise_on_follows_the_noise_model_and_seeds(tmp_path):
    noise = NoiseModel(log_mu=0.0, log_sigma=0.2, p_stall=0.02, stall_excess_mean=3.0)
    w = reqs(np.linspace(0, 200, 400), np.full(400, 300), np.full(400, 200))
    res = toy_twin(noise=noise, noise_on=True, seed=5).run(w, fixed_router(np.zeros(400, dtype=int)))
    prof = toy_profile(noise=noise)
    ratio = (res.steps["end_s"] - res.steps["start_s"]).to_numpy() / prof.typical(res.steps)
    assert abs(np.median(np.log(ratio[ratio < 2.5])) - 0.0) < 0.02
    assert abs((ratio > 2.5).mean() - 0.02) < 0.006
    assert ratio.mean() == pytest.approx(noise.mean_ratio(), rel=0.03)
    again = toy_twin(noise=noise, noise_on=True, seed=5).run(w, fixed_router(np.zeros(400, dtype=int)))
    other = toy_twin(noise=noise, noise_on=True, seed=6).run(w, fixed_router(np.zeros(400, dtype=int)))
    for name, r in (("a", res), ("b", again), ("c", other)):
        with TraceWriter(tmp_path / name) as tw:
            tw.write_table("requests", r.requests)
            tw.write_table("steps", r.steps)
            tw.write_table("step_items", r.step_items)
            tw.write_table("instances", r.instances)
    for table in ("requests", "steps", "step_items", "instances"):
        assert (tmp_path / "a" / f"{table}.parquet").read_bytes() == (tmp_path / "b" / f"{table}.parquet").read_bytes()
    assert (tmp_path / "a" / "steps.parquet").read_bytes() != (tmp_path / "c" / "steps.parquet").read_bytes()


@pytest.mark.parametrize("policy", ["vllm-v1", "sarathi", "vllm-v0"])
def test_every_policy_serves_everything_under_kv_pressure(policy):
    w = generate_workload(WorkloadConfig(requests=300, seed=3)).requests
    w["prompt_tokens"] = np.minimum(w["prompt_tokens"], 1500)
    w["arrival_s"] = w["arrival_s"] / 10
    budget = 4096 if policy == "vllm-v0" else 2048  # without chunking the budget covers max_model_len
    twin = toy_twin(policy=policy, num_kv_blocks=400, max_model_len=4096, n=2, max_num_batched_tokens=budget)
    res = twin.run(w, fixed_router(np.arange(len(w)) % 2))  # round robin
    r = res.requests
    assert r["ttft_s"].notna().all() and r["finish_s"].notna().all()
    assert (r["finish_s"] >= r["arrival_s"] + r["ttft_s"] - 1e-9).all()
    assert r["instance_id"].tolist()[:4] == ["i0", "i1", "i0", "i1"]
    # every request's tokens were computed: prompt + outputs - 1 (+ any recompute)
    done = res.step_items.groupby("request_id")["tokens"].sum()
    need = (w["prompt_tokens"] + w["output_tokens"] - 1).to_numpy()
    assert (done.sort_index().to_numpy() >= need).all()
    if policy == "vllm-v0":
        mixed = res.step_items.assign(pre=res.step_items["computed_before"] < res.step_items["prompt_tokens"])
        kinds = mixed.groupby(["instance_id", "step"])["pre"].agg(["min", "max"])
        assert (kinds["min"] == kinds["max"]).all()  # never prefill and decode in one step


def test_request_too_large_for_the_kv_cache_is_rejected_not_hung():
    w = reqs([0.0, 0.1], [5000, 100], [2, 2])
    res = toy_twin(num_kv_blocks=100).run(w, fixed_router(np.zeros(2, dtype=int)))  # 99 blocks of 16
    assert np.isnan(res.requests["ttft_s"].iloc[0]) and res.requests["ttft_s"].iloc[1] > 0
    assert res.extra["rejected"] == 1


# ----------------------------------------------------------------- validate on real recordings


def test_validate_cli_on_a_recording(tmp_path):
    d1 = shared("vllm_cpu", "d1_tinya_poisson_r3")
    d2 = shared("vllm_cpu", "d2_tinya_poisson_r5")
    for name, src in (("d1", d1), ("d2", d2)):
        assert run_cli("trace", "import", "vllm-record", src, "--out", tmp_path / name).exit_code == 0
    assert run_cli("calibrate", tmp_path / "d2", "--out", tmp_path / "d2.json").exit_code == 0
    res = run_cli("validate", tmp_path / "d1", "--profile", tmp_path / "d2.json", "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "v" / "metrics.json").read_text())
    assert m["decision_agreement"]["rate"] == 1.0 and m["decision_agreement"]["steps"] == 6017
    assert 0.9 < m["steps"]["ratio"] < 1.1
    assert m["ttft"]["n"] == 200 and 0.05 < m["ttft"]["mape"] < 0.3
    per = pd.read_parquet(tmp_path / "v" / "requests.parquet")
    assert len(per) == 200 and {"ttft_true_s", "ttft_twin_s", "ape"} <= set(per.columns)
    assert open_trace(tmp_path / "v" / "twin").meta["tables"]["requests"] == 200
    res = run_cli("validate", tmp_path / "d1", "--out", tmp_path / "v2")
    assert res.exit_code == 2
