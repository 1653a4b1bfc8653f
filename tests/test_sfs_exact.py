"""Exactness of SFS on the twin: with noise off and no later arrival at the
probed instance, SFS (oracle lengths) must predict the twin's TTFT to
1e-9 s, for every policy: both run the same kernel and the same charges."""
from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estimators.batch_fit import NoiseModel, StallAllowance
from estimators.engine.config import InstanceConfig
from estimators.profile import BatchTimeProfile
from estimators.sfs import SFS
from estimators.snapshot import Query
from harness.twin import InstanceSpec, Twin, TwinConfig


@st.composite
def scenarios(draw):
    policy = draw(st.sampled_from(["vllm-v1", "sarathi", "vllm-v0"]))
    n = draw(st.integers(1, 25))
    gaps = draw(st.lists(st.floats(0.0, 0.3), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 900), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 80), min_size=n, max_size=n))
    budget = draw(st.sampled_from([64, 256, 1024]))
    max_len = 1024 if policy == "vllm-v0" else 4096
    engine = InstanceConfig(policy=policy, max_num_batched_tokens=max(budget, max_len) if policy == "vllm-v0" else budget,
                          max_num_seqs=draw(st.integers(1, 16)), block_size=16,
                          num_kv_blocks=draw(st.integers(30, 400)),
                          long_prefill_token_threshold=draw(st.sampled_from([0, 0, 32])) if policy == "vllm-v1" else 0,
                          max_model_len=max_len)
    gap = draw(st.sampled_from([0.0, 0.0004]))
    form = draw(st.sampled_from(["eq9", "six"]))
    coef = np.array([5e-3, 2e-5, 1e-7, 3e-9]) if form == "eq9" else np.array([5e-3, 2e-5, 3e-5, 4e-8, 5e-10, 2e-13])
    prof = BatchTimeProfile("p", form, coef, NoiseModel(log_sigma=0.1, p_stall=0.01, stall_excess_mean=2.0),
                            step_gap_s=gap, allowance=StallAllowance(0.002, 5.0))
    return engine, prof, np.cumsum(gaps), prompts, outputs


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_sfs_equals_twin_without_noise(scenario):
    engine, prof, arrivals, prompts, outputs = scenario
    n = len(arrivals)
    reqs = pd.DataFrame({"request_id": np.arange(n), "arrival_s": arrivals, "prompt_tokens": prompts,
                         "output_tokens": outputs})
    sfs = SFS(prof, np.asarray(outputs, dtype=np.int64))
    probe = n - 1  # the last arrival: its instance's future holds no other arrival
    got = {}

    def on_arrival(i, t, insts):
        if i == probe:
            got["est"] = sfs.estimate(insts[0].snapshot(t), Query(i, t, prompts[i]))
            got["live"] = sfs.estimate(insts[0], Query(i, t, prompts[i]))  # the live instance is a view too

    twin = Twin([InstanceSpec(engine, prof)], TwinConfig(noise=False, record_steps=False))
    res = twin.run(reqs, lambda i, t, insts: 0, on_arrival=on_arrival)
    true = res.requests["ttft_s"].iloc[probe]
    assert got["live"] == got["est"] or not (np.isfinite(got["live"]) or np.isfinite(got["est"]))
    if np.isfinite(true):
        assert abs(got["est"] - true) <= 1e-9, (got["est"], true)
    else:
        assert not np.isfinite(got["est"])
