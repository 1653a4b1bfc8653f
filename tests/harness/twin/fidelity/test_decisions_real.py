"""Decision agreement with the real vLLM engine: for every step of every
recording in ../shared/data/vllm_cpu, the kernel given the recorded pre-step
state chooses exactly the recorded batch (requests, token counts, computed
tokens before each chunk, order and preemptions). With prefix caching (d8,
d9, d10) the cache's contents are rebuilt along the recorded batches and the
kernel's hits must be the engine's: every request's first chunk starts at its
recorded ``cached_tokens``."""
from __future__ import annotations

from harness.twin.fidelity.decisions import decision_agreement
from traces.store import open_trace


def test_every_recorded_batch_is_reproduced(recordings):
    total = 0
    caching = 0
    for rec in sorted(recordings.iterdir()):
        trace = open_trace(rec)
        res = decision_agreement(trace)
        assert res.steps == trace.meta["tables"]["steps"]
        assert res.agree == res.steps, (rec.name, res.mismatches[:3])
        total += res.steps
        if trace.read("instances")["prefix_caching"].item():  # engine.json's key (absent = recorded off)
            caching += 1
            r = trace.read("requests")
            granted = [res.first_computed[int(i)] for i in r["request_id"]]
            assert granted == r["cached_tokens"].tolist(), rec.name
            assert sum(granted) > 0.5 * r["prompt_tokens"].sum()
    assert caching == 3
    assert total > 45_000
