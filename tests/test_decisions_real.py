"""Decision agreement with the real vLLM engine: for every step of every
recording in ../shared/data/vllm_cpu, the kernel given the recorded pre-step
state chooses exactly the recorded batch (requests, token counts, order and
preemptions)."""
from __future__ import annotations

import json

from harness.decisions import decision_agreement
from tests.conftest import shared
from traces.store import open_trace


def _prefix_caching(name: str) -> bool:
    """Recordings made with vLLM's prefix caching on. The kernel does not model
    the block cache yet (issue 12, prefix caching): their admissions start at a
    cache hit, so they are scoped out here until that issue lands. Lift this
    scope when it does; never loosen the agreement bound instead."""
    engine = json.loads((shared("vllm_cpu", name) / "engine.json").read_text())
    return bool(engine.get("prefix_caching", False))


def test_every_recorded_batch_is_reproduced(recordings):
    total = 0
    for rec in sorted(recordings.iterdir()):
        if _prefix_caching(rec.name):
            continue
        res = decision_agreement(open_trace(rec))
        assert res.steps == open_trace(rec).meta["tables"]["steps"]
        assert res.agree == res.steps, (rec.name, res.mismatches[:3])
        total += res.steps
    assert total > 30_000
