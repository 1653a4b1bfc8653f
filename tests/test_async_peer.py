"""Peer suite, async scheduling: latroute's kernel in async mode against
vLLM 0.32's real ``AsyncScheduler`` driven through the engine core's own
``step_with_batch_queue`` (``tests/peer/generate_fixtures.py``; the rules are
``docs/reference/async-scheduling.md``).

``tests/peer/fixtures/async`` holds every scenario of the synchronous suite
and the async-specific ones, recorded one call of ``step_with_batch_queue``
at a time. Each must agree step by step with the kernel in async mode
(batch with placeholders, preemptions, queues, free blocks, which call's
outputs were applied, finishes); each async-specific one must disagree with
the kernel's synchronous rules, so the suite can tell the two modes apart.
Regenerating them needs vLLM (``LATROUTE_VLLM_PYTHON``), checked by the last
test, which skips cleanly without it.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.peer.latroute_side import run_scenario, run_scenario_async
from tests.test_vllm_peer import FIELDS, assert_agrees, first_difference, load

PEER = Path(__file__).resolve().parent / "peer"
ASYNC = sorted((PEER / "fixtures" / "async").glob("*.json"))
ASYNC_FIELDS = FIELDS + ("completed",)
SYNC_NAMES = {p.stem for p in (PEER / "fixtures").glob("*.json")}


def _diff(expected: list[dict], got: list[dict]) -> str | None:
    return first_difference(expected, got, ASYNC_FIELDS)


@pytest.mark.parametrize("path", ASYNC, ids=[p.stem for p in ASYNC])
def test_async_kernel_agrees_with_vllm_async_scheduler(path: Path):
    fx = load(path)
    assert fx["async_scheduling"] is True
    assert_agrees(fx, *run_scenario_async(fx, len(fx["steps"])), ASYNC_FIELDS)


def test_suite_covers_every_sync_scenario_and_eight_async_ones():
    names = {p.stem for p in ASYNC}
    assert SYNC_NAMES <= names
    assert len(names - SYNC_NAMES) >= 8


@pytest.mark.parametrize("path", [p for p in ASYNC if p.stem not in SYNC_NAMES],
                         ids=[p.stem for p in ASYNC if p.stem not in SYNC_NAMES])
def test_async_specific_scenarios_disagree_with_sync_rules(path: Path):
    """The synchronous kernel, run call for call, differs from vLLM's async
    scheduler somewhere (a record it cannot reproduce)."""
    fx = load(path)
    _, steps = run_scenario(fx, len(fx["steps"]))
    assert first_difference(fx["steps"], steps) is not None


@pytest.mark.parametrize("path", sorted((PEER / "fixtures").glob("*.json")),
                         ids=[p.stem for p in sorted((PEER / "fixtures").glob("*.json"))])
def test_async_rules_in_synchronous_order_are_the_sync_scheduler(path: Path):
    """What makes the async fixtures worth having: the async rules, driven
    with each step's outputs applied before the next plan, are exactly
    vLLM's synchronous scheduler (the batch queue is what changes things)."""
    fx = load(path)
    _, steps = run_scenario(fx, len(fx["steps"]), async_rules=True)
    assert first_difference(fx["steps"], steps) is None


def test_async_setting_is_checked():
    from estimators.engine.config import InstanceConfig

    assert InstanceConfig().async_scheduling is False
    with pytest.raises(ValueError, match="async_scheduling is vLLM V1's"):
        InstanceConfig(policy="sarathi", async_scheduling=True)
    with pytest.raises(ValueError, match="async_scheduling must be true or false"):
        InstanceConfig(async_scheduling="yes")
    row = InstanceConfig(async_scheduling=True).to_row()
    assert InstanceConfig.from_row(row).async_scheduling is True


def test_builtin_pools_keep_async_scheduling_off():
    from harness.twin.pools import load_pool

    for name in ("qwen3-h100", "qwen3-h100-pc", "qwen3-h100-x8"):
        assert not any(c.async_scheduling for c in load_pool(name).instances), name


def test_twin_refuses_an_async_instance_it_cannot_drive():
    """The twin's loop applies outputs before the next plan (sync order):
    an async instance is refused, not silently run with the sync timeline."""
    from estimators.engine.config import InstanceConfig
    from harness.twin.instance import Instance, InstanceSpec, TwinConfig

    spec = InstanceSpec.from_config(InstanceConfig(instance_id="a", model="qwen3-8b", profile="qwen3-8b-h100",
                                                   async_scheduling=True))
    with pytest.raises(ValueError, match="instance a: async_scheduling is not supported by the engine twin"):
        Instance(0, spec, TwinConfig())


def test_placeholders_are_compared():
    """The comparison can fail: a placeholder count off by one is caught at its step."""
    fx = load(PEER / "fixtures" / "async" / "async_preempt_in_flight.json")
    _, steps = run_scenario_async(fx, len(fx["steps"]))
    steps[1] = {**steps[1], "batch": [[*item[:3], item[3] + 1] for item in steps[1]["batch"]]}
    assert _diff(fx["steps"], steps).startswith("step 2: batch differs")


def test_regenerated_fixtures_match_the_committed_ones(tmp_path: Path):
    """vLLM's real schedulers, rerun now, give the committed fixtures byte for
    byte (needs vLLM's environment: ``LATROUTE_VLLM_PYTHON``)."""
    python = os.environ.get("LATROUTE_VLLM_PYTHON")
    if not python:
        pytest.skip("LATROUTE_VLLM_PYTHON not set (the Python of an environment with vLLM 0.32)")
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    res = subprocess.run([python, str(PEER / "generate_fixtures.py"), "--out", str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    for sub in ("", "async"):
        for path in sorted((PEER / "fixtures" / sub).glob("*.json")):
            assert (tmp_path / sub / path.name).read_text() == path.read_text(), f"{sub}/{path.name} changed"
