"""The engine model package: its step log (twin traces keep their
preemptions, so the decision check rebuilds their states exactly) and
finishing at max_model_len as vLLM does."""
from __future__ import annotations

import numpy as np
import pandas as pd

from estimators.engine.config import InstanceConfig
from estimators.engine.kernel import complete_step, schedule_step
from estimators.engine.layout import EV_FINISH, EV_LENGTH, F_BLOCKS, F_EVENT, F_OUTPUTS, S_FREE_BLOCKS, S_NR
from estimators.engine.state import SchedState, StepPlan
from estimators.engine.view import Query
from estimators.sfs.estimator import SFS
from estimators.snapshot import Snapshot
from harness.twin.fidelity.decisions import decision_agreement
from harness.twin.fidelity.validate import validate
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig, fixed_router, write_twin_trace
from tests.harness.twin.test_twin import toy_profile
from traces.store import TraceWriter, open_trace


def test_max_model_len_finishes_the_request_and_frees_its_blocks():
    # the example: prompt 60, max_model_len 64, output 20, block size 16.
    # step 0 prefills 60 tokens (4 blocks) and samples token 1 (61 tokens);
    # steps 1-3 decode one token each; after step 3 prompt + outputs = 64 =
    # max_model_len, so vLLM's check_stop finishes it ("length") and frees
    # its blocks, 16 outputs short of its own end.
    cfg = InstanceConfig(max_num_batched_tokens=64, max_num_seqs=8, block_size=16, num_kv_blocks=10, max_model_len=64)
    st = SchedState.new(cfg, capacity=4)
    s = st.add(0, 60, 20)
    plan = StepPlan.new(4)
    batches = []
    for _ in range(4):
        n = schedule_step(st, plan)
        batches.append([(int(plan.slot[j]), int(plan.tokens[j])) for j in range(n)])
        complete_step(st, plan, n)
    assert batches == [[(s, 60)], [(s, 1)], [(s, 1)], [(s, 1)]]
    assert st.req[s, F_OUTPUTS] == 4
    assert st.req[s, F_EVENT] == EV_FINISH | EV_LENGTH
    assert st.sc[S_NR] == 0 and st.req[s, F_BLOCKS] == 0
    assert st.sc[S_FREE_BLOCKS] == 10 - 1  # all blocks free (one is vLLM's null block)
    assert schedule_step(st, plan) == 0  # nothing left to run


def test_twin_records_length_finishes():
    spec = InstanceSpec(InstanceConfig(max_num_batched_tokens=64, max_num_seqs=8, num_kv_blocks=10,
                                       max_model_len=64), toy_profile())
    reqs = pd.DataFrame({"request_id": [0, 1], "arrival_s": [0.0, 5.0], "prompt_tokens": [60, 10],
                         "output_tokens": [20, 5]})
    res = Twin([spec], TwinConfig(noise=False)).run(reqs, fixed_router(np.zeros(2, dtype=int)))
    assert res.requests["finish_reason"].tolist() == ["length", "stop"]
    assert len(res.steps) == 4 + 5  # request 0 leaves after 4 steps instead of 20


def overload_twin_trace(path):
    """A twin run on a KV cache far too small for its load: it preempts."""
    rng = np.random.default_rng(3)
    n = 600
    reqs = pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.sort(rng.uniform(0, 30, n)),
                         "prompt_tokens": rng.integers(20, 300, n), "output_tokens": rng.integers(20, 200, n)})
    spec = InstanceSpec(InstanceConfig(instance_id="tight", max_num_batched_tokens=512, max_num_seqs=32,
                                       block_size=16, num_kv_blocks=120, max_model_len=4096), toy_profile(0.0005))
    res = Twin([spec], TwinConfig(noise=True, seed=1)).run(reqs, fixed_router(np.zeros(n, dtype=int)))
    with TraceWriter(path) as w:
        write_twin_trace(w, res)
    return res


def test_twin_trace_with_preemptions_replays_exactly_through_the_decision_check(tmp_path):
    res = overload_twin_trace(tmp_path / "t")
    own = int(res.requests["preemptions"].sum())
    assert own >= 100, own  # an overload run
    tr = open_trace(tmp_path / "t")
    pre = tr.read("preemptions")
    assert len(pre) == own and int(tr.read("steps")["num_preempted"].sum()) == own
    agreement = validate(tr, toy_profile(0.0005), noise=False).metrics["decision_agreement"]  # validate's check
    assert agreement["steps"] == len(res.steps) and agreement["agree"] == agreement["steps"], \
        agreement["per_instance"]["tight"]["first_mismatches"][:3]


def test_prompts_without_room_for_one_output_are_refused_at_arrival():
    # vLLM's input processor refuses prompt_len >= max_model_len before the scheduler sees it
    spec = InstanceSpec(InstanceConfig(max_num_batched_tokens=64, max_num_seqs=8, num_kv_blocks=20,
                                       max_model_len=64), toy_profile())
    reqs = pd.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 0.0, 0.0], "prompt_tokens": [64, 63, 10],
                         "output_tokens": [5, 5, 5]})
    res = Twin([spec], TwinConfig(noise=False)).run(reqs, fixed_router(np.zeros(3, dtype=int)))
    assert res.extra["rejected"] == 1 and np.isnan(res.requests["ttft_s"].iloc[0])
    assert res.requests["finish_reason"].tolist()[1:] == ["length", "stop"]  # 63 + 1 output = 64
    assert pd.isna(res.requests["finish_reason"].iloc[0])
    sfs = SFS(toy_profile(), np.array([5, 5, 5]))
    snap = Snapshot(0.0, "i0", SchedState.new(spec.config, capacity=4), np.zeros(4, dtype=np.int64), 0,
                    StepPlan.new(4), 0, None)
    assert sfs.estimate(snap, Query(0, 0.0, 64)) == np.inf
    assert np.isfinite(sfs.estimate(snap, Query(1, 0.0, 63)))


def test_a_twin_trace_with_a_request_the_kv_cache_cannot_hold_still_replays_exactly(tmp_path):
    # 99 usable blocks of 16 tokens; the 5000-token prompt can never be admitted and the
    # twin refuses it when nothing else runs: the rebuilt state must refuse it too
    spec = InstanceSpec(InstanceConfig(instance_id="small", max_num_batched_tokens=512, max_num_seqs=16,
                                       num_kv_blocks=100, max_model_len=32768), toy_profile(0.0005))
    reqs = pd.DataFrame({"request_id": np.arange(6), "arrival_s": [0.0, 0.001, 0.002, 0.5, 0.501, 0.9],
                         "prompt_tokens": [300, 5000, 200, 100, 700, 50], "output_tokens": [20, 5, 30, 10, 8, 3]})
    res = Twin([spec], TwinConfig(noise=False)).run(reqs, fixed_router(np.zeros(6, dtype=int)))
    assert res.extra["rejected"] == 1
    with TraceWriter(tmp_path / "t") as w:
        write_twin_trace(w, res)
    agreement = decision_agreement(open_trace(tmp_path / "t"), "small")
    assert agreement.steps == len(res.steps) and agreement.agree == agreement.steps, agreement.mismatches[:2]
