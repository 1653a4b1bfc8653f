"""Peer suite, async scheduling: latroute's kernel in async mode against
vLLM 0.32's real ``AsyncScheduler`` driven through the engine core's own
``step_with_batch_queue`` (``tests/peer/generate_fixtures.py``; the rules are
``docs/reference/async-scheduling.md``).

``tests/peer/fixtures/0.32.0/async`` holds every scenario of the synchronous suite
and the async-specific ones, recorded one call of ``step_with_batch_queue``
at a time. Each must agree step by step with the kernel in async mode
(batch with placeholders, preemptions, queues, free blocks, which call's
outputs were applied, finishes); each async-specific one must disagree with
the kernel's synchronous rules, so the suite can tell the two modes apart.
``tests/peer/fixtures/0.32.0/async_random.jsonl.gz`` holds the seeded random async
scenarios (``scenarios.random_async_scenarios``: arrivals at every step,
prompts around and above the budget, small KV pools, shared prefixes,
max_model_len and max_num_seqs limits), recorded the same way and checked
the same way (a prefix hit shows as an admitted item's computed tokens
before its step). Regenerating them needs vLLM (``LATROUTE_VLLM_PYTHON``),
checked by the last test, which skips cleanly without it. Other releases'
records are checked by ``test_vllm_release_peer``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.estimators.engine.test_vllm_peer import FIELDS, KERNEL, assert_agrees, first_difference, load
from tests.peer import random_fixtures, releases
from tests.peer.latroute_side import run_scenario, run_scenario_async
from tests.peer.scenarios import random_async_scenarios

ASYNC = releases.async_paths(releases.KERNEL_VERSION)
ASYNC_FIELDS = FIELDS + ("completed",)
SYNC_NAMES = {p.stem for p in releases.sync_paths(releases.KERNEL_VERSION)}


def _diff(expected: list[dict], got: list[dict]) -> str | None:
    return first_difference(expected, got, ASYNC_FIELDS)


@pytest.mark.parametrize("path", ASYNC, ids=[p.stem for p in ASYNC])
def test_async_kernel_agrees_with_vllm_async_scheduler(path: Path):
    fx = load(path)
    assert fx["async_scheduling"] is True
    assert_agrees(fx, *run_scenario_async(fx, len(fx["steps"])), ASYNC_FIELDS)


RANDOM = random_fixtures.load_all(releases.random_path(releases.KERNEL_VERSION))


@pytest.mark.parametrize("fx", RANDOM, ids=[fx["name"] for fx in RANDOM])
def test_random_scenarios_agree_with_vllm_async_scheduler(fx: dict):
    assert_agrees(fx, *run_scenario_async(fx, len(fx["steps"])), ASYNC_FIELDS)


def test_random_set_is_the_generators_and_exercises_what_it_is_for():
    """The file holds exactly the scenarios the generator makes now (at
    least 200), and they do what they are there for: preemptions, prefix
    hits on blocks other requests filled, finishes at max_model_len,
    max_num_seqs and the token budget binding, prompts above the budget,
    arrivals while batches are in flight."""
    made = random_async_scenarios()
    assert len(RANDOM) == len(made) >= 200
    assert [{k: fx[k] for k in ("name", "engine", "requests")} for fx in RANDOM] == \
        [{k: sc[k] for k in ("name", "engine", "requests")} for sc in made]
    assert {fx["vllm_version"] for fx in RANDOM} == {releases.KERNEL_VERSION}

    def count(pred):
        return sum(1 for fx in RANDOM if pred(fx))

    def shared_hit(fx):  # a first admission with computed tokens: only blocks another request filled can give them
        seen = set()
        for st in fx["steps"]:
            for rid, _, before, _ in st["batch"]:
                if rid not in seen and before > 0:
                    return True
                seen.add(rid)
        return False

    def at_max_model_len(fx):
        return any(r["prompt"] + r["max_tokens"] > fx["engine"]["max_model_len"] for r in fx["requests"])

    def seqs_bind(fx):
        return any(st["running"] is not None and len(st["running"]) == fx["engine"]["max_num_seqs"] and st["waiting"]
                   for st in fx["steps"])

    def budget_binds(fx):
        return any(sum(item[1] for item in st["batch"]) == fx["engine"]["max_num_batched_tokens"] for st in fx["steps"])

    n = len(RANDOM)
    assert count(lambda fx: any(st["preempted"] for st in fx["steps"])) >= n // 4
    assert count(shared_hit) >= n // 4
    assert count(at_max_model_len) >= n // 4
    assert count(seqs_bind) >= n // 4
    assert count(budget_binds) >= n // 2
    assert count(lambda fx: any(r["prompt"] > fx["engine"]["max_num_batched_tokens"] for r in fx["requests"])) >= n // 2
    assert all(len({r["arrival_step"] for r in fx["requests"]}) > 2 for fx in RANDOM)


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


@pytest.mark.parametrize("path", releases.sync_paths(releases.KERNEL_VERSION),
                         ids=[p.stem for p in releases.sync_paths(releases.KERNEL_VERSION)])
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
    from harness.twin.pools.spec import load_pool

    for name in ("qwen3-h100", "qwen3-h100-pc", "qwen3-h100-x8"):
        assert not any(c.async_scheduling for c in load_pool(name).instances), name


CALL_ONE = [p for p in ASYNC if all(r["arrival_step"] == 1 for r in load(p)["requests"])]


@pytest.mark.parametrize("path", CALL_ONE, ids=[p.stem for p in CALL_ONE])
def test_twin_runs_vllm_batch_queue(path: Path):
    """The engine twin's async loop (the twin loop's async mode, ``harness.twin.loop.kernel``) is the
    batch queue the fixtures recorded: every scenario whose requests all
    arrive before the first call, replayed on the twin, runs vLLM's
    non-empty batches in vLLM's order (request, tokens, computed before)."""
    import numpy as np
    import pandas as pd

    from estimators.timemodel.fit import NoiseModel
    from estimators.timemodel.profile import BatchTimeProfile
    from harness.twin.instance import InstanceSpec, TwinConfig
    from harness.twin.simulation import Twin
    from tests.peer.latroute_side import engine_config

    fx = load(path)
    rs = fx["requests"]
    reqs = pd.DataFrame({"request_id": np.arange(len(rs)), "arrival_s": np.zeros(len(rs)),
                         "prompt_tokens": [r["prompt"] for r in rs], "output_tokens": [r["max_tokens"] for r in rs]})
    prof = BatchTimeProfile("p", "eq9", np.array([0.01, 1e-5, 0.0, 0.0]), NoiseModel(), step_gap_s=0.002)
    res = Twin([InstanceSpec(engine_config(fx["engine"], async_scheduling=True), prof)],
               TwinConfig(noise=False)).run(reqs, lambda i, t, insts: 0)
    items = res.step_items
    got = [[[rs[int(r)]["id"], int(t), int(c)] for r, t, c in zip(g["request_id"], g["tokens"], g["computed_before"])]
           for _, g in items.groupby("step", sort=True)]
    want = [[b[:3] for b in st["batch"]] for st in fx["steps"] if st["batch"]]
    assert got == want


def test_placeholders_are_compared():
    """The comparison can fail: a placeholder count off by one is caught at its step."""
    fx = load(KERNEL / "async" / "async_preempt_in_flight.json")
    _, steps = run_scenario_async(fx, len(fx["steps"]))
    steps[1] = {**steps[1], "batch": [[*item[:3], item[3] + 1] for item in steps[1]["batch"]]}
    assert _diff(fx["steps"], steps).startswith("step 2: batch differs")


def test_regenerated_fixtures_match_the_committed_ones(tmp_path: Path):
    """vLLM's real schedulers, rerun now, give the committed fixtures byte for
    byte (needs vLLM's environment: ``LATROUTE_VLLM_PYTHON``)."""
    python = os.environ.get("LATROUTE_VLLM_PYTHON")
    if not python:
        pytest.skip("LATROUTE_VLLM_PYTHON not set (the Python of an environment with vLLM 0.32)")
    status, err = releases.regenerate(python, tmp_path)
    assert status == 0, err
    assert releases.changed_files(releases.KERNEL_VERSION, tmp_path) == []
