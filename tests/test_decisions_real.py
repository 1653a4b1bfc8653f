"""Decision agreement with the real vLLM engine: for every step of every
recording in ../shared/data/vllm_cpu, the kernel given the recorded pre-step
state chooses exactly the recorded batch (requests, token counts, order and
preemptions)."""
from __future__ import annotations


from harness.decisions import decision_agreement
from traces.store import open_trace




def test_every_recorded_batch_is_reproduced(recordings):
    total = 0
    for rec in sorted(recordings.iterdir()):
        res = decision_agreement(open_trace(rec))
        assert res.steps == open_trace(rec).meta["tables"]["steps"]
        assert res.agree == res.steps, (rec.name, res.mismatches[:3])
        total += res.steps
    assert total > 30_000
