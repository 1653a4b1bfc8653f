"""Hand-worked checks of every scheduling rule, one policy at a time."""
from __future__ import annotations

from estimators.engine.config import InstanceConfig
from estimators.engine.kernel import complete_step, schedule_step
from estimators.engine.layout import F_BLOCKS, F_COMPUTED, F_OUTPUTS, F_PREEMPTIONS, F_RID, S_FREE_BLOCKS
from estimators.engine.state import SchedState, StepPlan


class Engine:
    """A tiny driver: add requests, run schedule+complete, read batches."""

    def __init__(self, **kw):
        # the defaults these hand-worked cases were written against
        kw = {"max_num_seqs": 128, "num_kv_blocks": 10_000, "max_model_len": 32768, **kw}
        self.state = SchedState.new(InstanceConfig(**kw), capacity=8)
        self.slot = {}

    def add(self, rid, prompt, outputs=10):
        self.state = self.state.with_room()
        self.slot[rid] = self.state.add(rid, prompt, outputs)

    def step(self, complete=True):
        st = self.state
        plan = StepPlan.new(st.capacity)
        n = schedule_step(st, plan)
        batch = [(int(st.req[plan.slot[j], F_RID]), int(plan.tokens[j])) for j in range(n)]
        if complete:
            complete_step(st, plan, n)
        return batch

    def running(self):
        return self.state.rids(self.state.running_slots())

    def waiting(self):
        return self.state.rids(self.state.waiting_slots())

    def field(self, rid, f):
        return int(self.state.req[self.slot[rid], f])


def test_reference_worked_example_budget_split():
    # a worked example: budget 2048, 10 running decodes, a 5000-token prompt
    e = Engine(max_num_batched_tokens=2048, max_num_seqs=64, block_size=16, num_kv_blocks=100_000)
    for r in range(10):
        e.add(r, 100, outputs=100)
    e.step()  # 10 prefills of 100 tokens (1000 <= 2048) -> each samples its first token
    e.add(99, 5000, outputs=5)
    e.add(100, 500, outputs=5)
    assert e.step() == [(r, 1) for r in range(10)] + [(99, 2038)]
    assert e.step() == [(r, 1) for r in range(10)] + [(99, 2038)]
    # final chunk 924; the remaining 1114 tokens of budget go to the next waiting request
    assert e.step() == [(r, 1) for r in range(10)] + [(99, 924), (100, 500)]
    assert e.field(99, F_OUTPUTS) == 1 and e.field(100, F_OUTPUTS) == 1


def test_max_num_seqs_holds_a_request_in_waiting():
    e = Engine(max_num_batched_tokens=1000, max_num_seqs=2, block_size=16, num_kv_blocks=1000)
    for r in range(3):
        e.add(r, 10, outputs=3)
    assert e.step() == [(0, 10), (1, 10)]
    assert e.waiting() == [2]
    assert e.step() == [(0, 1), (1, 1)]
    assert e.step() == [(0, 1), (1, 1)]  # both finish (3 outputs)
    assert e.step() == [(2, 10)]


def test_long_prefill_cap_and_single_request_exemption():
    e = Engine(max_num_batched_tokens=512, max_num_seqs=8, block_size=16, num_kv_blocks=1000,
               long_prefill_token_threshold=128)
    e.add(0, 300)
    assert e.step() == [(0, 300)]  # alone: the cap does not apply
    e.add(1, 300)
    e.add(2, 300)
    assert e.step() == [(0, 1), (1, 128), (2, 128)]  # capped chunks, several mid-prefill at once
    assert e.step() == [(0, 1), (1, 128), (2, 128)]
    assert e.step() == [(0, 1), (1, 44), (2, 44)]


def test_admission_refused_for_lack_of_blocks_and_head_of_line():
    # 11 blocks, one is the null block: 10 usable of 16 tokens
    e = Engine(max_num_batched_tokens=64, max_num_seqs=8, block_size=16, num_kv_blocks=11)
    e.add(0, 100, outputs=2)  # needs 7 blocks for its whole prompt
    e.add(1, 64, outputs=2)  # needs 4: does not fit beside request 0
    e.add(2, 8, outputs=2)  # would fit, but sits behind the head
    assert e.step() == [(0, 64)]  # first chunk only, but the gate checked all 100 tokens
    assert e.field(0, F_BLOCKS) == 4 and e.state.sc[S_FREE_BLOCKS] == 6
    assert e.step() == [(0, 36)]  # 64 budget - 36 = 28 left, but request 1 needs 4 blocks, only 3 free
    assert e.waiting() == [1, 2]
    assert e.step() == [(0, 1)]  # request 0 finishes; its blocks return after the step
    assert e.step() == [(1, 64)]


def test_recompute_preemption_of_the_tail():
    # 9 usable blocks of 4 tokens; three requests whose decodes outgrow the pool
    e = Engine(max_num_batched_tokens=64, max_num_seqs=8, block_size=4, num_kv_blocks=10)
    e.add(0, 8, outputs=20)
    e.add(1, 8, outputs=20)
    e.add(2, 8, outputs=20)
    assert e.step() == [(0, 8), (1, 8), (2, 8)]  # 6 blocks used
    assert e.step() == [(0, 1), (1, 1), (2, 1)]  # computed 9 each: 3 more blocks, pool exhausted
    for _ in range(3):
        e.step()
    # computed 12 -> next decode needs a 4th block each; 2 needs one, none free: the tail (2) is preempted
    batch = e.step()
    assert batch == [(0, 1), (1, 1)]
    assert e.waiting() == [2] and e.field(2, F_COMPUTED) == 0 and e.field(2, F_PREEMPTIONS) == 1
    # nobody is admitted in a step with a preemption; afterwards 2 is recomputed over prompt + outputs
    outputs_2 = e.field(2, F_OUTPUTS)
    assert e.running() == [0, 1]
    for _ in range(30):
        b = e.step()
        if any(r == 2 for r, _ in b):
            assert (2, 8 + outputs_2) in b  # whole sequence re-prefilled
            break
    else:
        raise AssertionError("request 2 was never resumed")


def test_preemption_pushes_to_front_in_order():
    # 4 usable blocks of 4 tokens, three 4-token prompts
    e = Engine(max_num_batched_tokens=64, max_num_seqs=8, block_size=4, num_kv_blocks=5)
    for r in range(3):
        e.add(r, 4, outputs=30)
    assert e.step() == [(0, 4), (1, 4), (2, 4)]  # 3 blocks, 1 free
    # decodes at computed 4 need a 2nd block each: 0 takes the free one, 1 forces the tail (2) out
    assert e.step() == [(0, 1), (1, 1)]
    assert e.waiting() == [2]
    for _ in range(3):
        assert e.step() == [(0, 1), (1, 1)]
    # at computed 8 both need a 3rd block: 0 preempts the tail, which is now 1
    assert e.step() == [(0, 1)]
    assert e.waiting() == [1, 2]  # the latest victim goes to the very front
    assert e.field(1, F_PREEMPTIONS) == 1 and e.field(2, F_PREEMPTIONS) == 1


def test_v0_prefill_only_steps():
    e = Engine(policy="vllm-v0", max_num_batched_tokens=100, max_num_seqs=8, block_size=16, num_kv_blocks=1000,
               chunked_prefill=False, max_model_len=100)
    e.add(0, 50, outputs=5)
    assert e.step() == [(0, 50)]
    e.add(1, 30, outputs=5)
    e.add(2, 40, outputs=5)
    e.add(3, 40, outputs=5)
    assert e.step() == [(1, 30), (2, 40)]  # prefill-only: request 0 does not decode; 3 exceeds the budget
    assert e.step() == [(3, 40)]
    assert e.step() == [(0, 1), (1, 1), (2, 1), (3, 1)]


def test_v0_rejects_prompt_longer_than_budget():
    e = Engine(policy="vllm-v0", max_num_batched_tokens=100, max_num_seqs=8, block_size=16, num_kv_blocks=1000,
               chunked_prefill=False, max_model_len=100)
    e.add(0, 500)
    e.add(1, 20)
    assert e.step() == [(1, 20)]
    assert e.waiting() == []


def test_engine_config_refuses_what_vllm_refuses():
    import pytest
    with pytest.raises(ValueError, match="max_model_len"):
        InstanceConfig(policy="vllm-v0", max_num_batched_tokens=2048, max_model_len=4096).to_array()
    with pytest.raises(ValueError, match="max_num_seqs"):
        InstanceConfig(max_num_batched_tokens=64, max_num_seqs=128).to_array()
    with pytest.raises(ValueError, match="policy"):
        InstanceConfig(policy="fifo").to_array()


def test_sarathi_decodes_first():
    e = Engine(policy="sarathi", max_num_batched_tokens=100, max_num_seqs=8, block_size=16, num_kv_blocks=1000)
    e.add(0, 250, outputs=5)  # long prefill, in progress
    assert e.step() == [(0, 100)]
    e.add(1, 20, outputs=5)
    assert e.step() == [(0, 100)]
    assert e.step() == [(0, 50), (1, 20)]
    e.add(2, 300, outputs=5)
    # both have finished prefill: decodes come first, then the new prefill
    assert e.step() == [(0, 1), (1, 1), (2, 98)]
    # V1 would walk running in admission order; Sarathi still puts decodes before the ongoing prefill
    e2 = Engine(policy="sarathi", max_num_batched_tokens=100, max_num_seqs=8, block_size=16, num_kv_blocks=1000)
    e2.add(0, 150, outputs=5)
    e2.add(1, 10, outputs=5)
    assert e2.step() == [(0, 100)]
    assert e2.step() == [(0, 50), (1, 10)]
    e2.add(2, 500, outputs=5)
    e2.step()  # decodes 0,1 then 2's first chunk
    assert e2.step()[:2] == [(0, 1), (1, 1)]


def test_sarathi_allocates_whole_prompt_with_watermark():
    e = Engine(policy="sarathi", max_num_batched_tokens=32, max_num_seqs=8, block_size=16, num_kv_blocks=201)
    e.add(0, 160, outputs=3)
    e.step()
    assert e.field(0, F_BLOCKS) == 10  # all 160 prompt tokens, though only 32 were computed
    e.add(1, 16 * 189, outputs=2)  # would leave 200 - 10 - 189 = 1 < watermark 2
    e.step()
    assert 1 in e.waiting()
