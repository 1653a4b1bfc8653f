"""Decision agreement with the real vLLM engine: for every step of every
recording in ../shared/data/vllm_cpu, the kernel given the recorded pre-step
state chooses exactly the recorded batch (requests, token counts, order and
preemptions)."""
from __future__ import annotations

import pytest

from harness.decisions import decision_agreement
from tests.conftest import run_cli, shared
from traces.store import open_trace


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    root = shared("vllm_cpu")
    out = tmp_path_factory.mktemp("rec")
    for rec in sorted(p for p in root.iterdir() if p.is_dir()):
        assert run_cli("trace", "import", "vllm-record", rec, "--out", out / rec.name).exit_code == 0
    return out


def test_every_recorded_batch_is_reproduced(recordings):
    total = 0
    for rec in sorted(recordings.iterdir()):
        res = decision_agreement(open_trace(rec))
        assert res.steps == open_trace(rec).meta["tables"]["steps"]
        assert res.agree == res.steps, (rec.name, res.mismatches[:3])
        total += res.steps
    assert total > 30_000
