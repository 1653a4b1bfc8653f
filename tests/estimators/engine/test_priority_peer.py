"""Peer suite, priority scheduling: latroute's kernel under vLLM's
``--scheduling-policy priority`` against vLLM 0.32's real scheduler.

``tests/peer/fixtures/0.32.0/priority`` holds the scenarios of
``scenarios.priority_scenarios`` recorded by vLLM 0.32's ``Scheduler`` built
with ``policy="priority"`` (each request's priority passed to its
``Request``), sync, and in ``priority/async`` the same scenarios through
``AsyncScheduler`` and the engine core's batch queue
(``generate_fixtures.py --mode priority``). Each must agree with the kernel
step by step, as the FCFS fixtures do (``test_vllm_peer``,
``test_async_peer``). They are the kernel release's only: the release
matrix (every release holds every FCFS scenario) is unchanged, and the
priority rules are refused for other releases (``InstanceConfig``).
"""
from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest

from estimators.engine.config import InstanceConfig
from estimators.engine.state import SchedState
from tests.estimators.engine.test_async_peer import ASYNC_FIELDS
from tests.estimators.engine.test_vllm_peer import FIELDS, assert_agrees, first_difference, load
from tests.peer import releases
from tests.peer.latroute_side import request_ids, run_scenario, run_scenario_async
from tests.peer.scenarios import priority_scenarios

SYNC = releases.priority_paths(releases.KERNEL_VERSION, "sync")
ASYNC = releases.priority_paths(releases.KERNEL_VERSION, "async")
# the one scenario whose steps FCFS also gives: a preempted request of the best priority goes back to the
# front under either policy (it is there for what it pins, not to tell the policies apart)
SAME_UNDER_FCFS = {"prio_preempted_high_returns_first"}


@pytest.mark.parametrize("path", SYNC, ids=[p.stem for p in SYNC])
def test_priority_kernel_agrees_with_vllm_step_by_step(path: Path):
    fx = load(path)
    assert fx["engine"]["scheduling_policy"] == "priority"
    assert_agrees(fx, *run_scenario(fx, len(fx["steps"])))


@pytest.mark.parametrize("path", ASYNC, ids=[p.stem for p in ASYNC])
def test_priority_async_kernel_agrees_with_vllm_async_scheduler(path: Path):
    fx = load(path)
    assert fx["async_scheduling"] is True and fx["engine"]["scheduling_policy"] == "priority"
    assert_agrees(fx, *run_scenario_async(fx, len(fx["steps"])), ASYNC_FIELDS)


def test_priority_fixtures_are_the_generators_scenarios():
    """Both folders hold exactly the generator's scenarios as it writes them
    now (a scenario edited without regenerating fails), at least fifteen,
    recorded by the kernel's release; together they exercise what the
    policy changes: preemptions, a victim that is not the tail of running,
    ties in priority, prefix caching, max_num_seqs, async scheduling."""
    made = {sc["name"]: sc for sc in priority_scenarios()}
    assert len(made) >= 15
    for paths, is_async in ((SYNC, False), (ASYNC, True)):
        stored = {load(p)["name"]: load(p) for p in paths}
        assert set(stored) == set(made)
        for name, fx in stored.items():
            assert fx["vllm_version"] == releases.KERNEL_VERSION
            assert fx.get("async_scheduling", False) is is_async
            assert {k: fx[k] for k in ("engine", "requests")} == {k: made[name][k] for k in ("engine", "requests")}
    fxs = [load(p) for p in SYNC + ASYNC]
    assert sum(len(st["preempted"]) for fx in fxs for st in fx["steps"]) >= 20
    assert any(fx["engine"]["prefix_caching"] for fx in fxs)
    assert any(fx["engine"]["max_num_seqs"] <= 2 for fx in fxs)
    # a victim that is not the tail of running (the FCFS rule's): seen in the records
    not_tail = 0
    for fx in fxs:
        before = []
        for st in fx["steps"]:
            not_tail += sum(1 for v in st["preempted"] if v in before and before.index(v) < len(before) - 1)
            before = st["running"] if st["running"] is not None else before
    assert not_tail >= 5
    # a request preempting itself: an empty batch with a preemption
    assert any(not st["batch"] and st["preempted"] for fx in fxs for st in fx["steps"])


@pytest.mark.parametrize("path", SYNC, ids=[p.stem for p in SYNC])
def test_priority_scenarios_tell_the_policies_apart(path: Path):
    """The same scenario under FCFS (priorities dropped) gives other steps,
    so each fixture checks the priority rules, not only the FCFS ones; the
    one exception is listed."""
    fx = load(path)
    fcfs = copy.deepcopy(fx)
    fcfs["engine"]["scheduling_policy"] = "fcfs"
    for r in fcfs["requests"]:
        del r["priority"]
    _, steps = run_scenario(fcfs, len(fx["steps"]))
    differs = first_difference(fx["steps"], steps, FIELDS) is not None
    assert differs is (fx["name"] not in SAME_UNDER_FCFS)


def test_ties_broken_by_request_id_instead_of_arrival_fail():
    """A planted bug: ties in priority broken by request id alone (the
    arrival time dropped) fails a fixture, at the step where two requests of
    equal priority that arrived at different steps are ordered."""
    fx = load(releases.folder(releases.KERNEL_VERSION) / releases.PRIORITY / "prio_tie_arrival_before_id.json")
    _, steps = run_scenario(fx, len(fx["steps"]), plant="no_arrival")
    diff = first_difference(fx["steps"], steps)
    assert diff is not None and "waiting differs" in diff
    failing = []
    for path in SYNC:
        f = load(path)
        if first_difference(f["steps"], run_scenario(f, len(f["steps"]), plant="no_arrival")[1]) is not None:
            failing.append(f["name"])
    assert "prio_tie_arrival_before_id" in failing


def test_ties_broken_in_insertion_order_instead_of_request_id_fail():
    """A planted bug: equal priority and arrival broken by the order the
    requests were added, not vLLM's request-id order, fails a fixture."""
    fx = load(releases.folder(releases.KERNEL_VERSION) / releases.PRIORITY / "prio_tie_same_step_by_id.json")
    _, steps = run_scenario(fx, len(fx["steps"]), plant="fixture_ids")
    assert first_difference(fx["steps"], steps) is not None


def test_request_ids_follow_vllms_string_order():
    assert request_ids([{"id": "c"}, {"id": "a"}, {"id": "10"}, {"id": "9"}]) == [3, 2, 0, 1]


def test_scheduling_policy_setting_is_checked():
    """fcfs is the default; priority is vLLM V1's at the kernel's release only,
    refused by name otherwise; a request priority needs the priority policy."""
    assert InstanceConfig().scheduling_policy == "fcfs"
    assert InstanceConfig.from_row({"scheduling_policy": ""}).scheduling_policy == "fcfs"
    assert InstanceConfig.from_row({"scheduling_policy": "priority"}).scheduling_policy == "priority"
    with pytest.raises(ValueError, match="unknown scheduling_policy 'lifo'"):
        InstanceConfig(scheduling_policy="lifo")
    with pytest.raises(ValueError, match="scheduling_policy priority is vLLM V1's"):
        InstanceConfig(policy="sarathi", scheduling_policy="priority")
    with pytest.raises(ValueError, match="not vllm_version 0.28.0's"):
        InstanceConfig(scheduling_policy="priority", vllm_version="0.28.0")
    InstanceConfig(scheduling_policy="priority", vllm_version="0.32.1")
    fcfs = SchedState.new(InstanceConfig(num_kv_blocks=64), capacity=4)
    with pytest.raises(ValueError, match="priority 2 on an instance whose scheduling_policy is fcfs"):
        fcfs.add(0, 10, 2, priority=2)


def test_rows_keep_their_width_under_fcfs():
    """Only priority instances carry the priority columns (SFS copies rows)."""
    widths = {(pol, asy): SchedState.new(InstanceConfig(num_kv_blocks=64, scheduling_policy=pol,
                                                        async_scheduling=asy), capacity=4).req.shape[1]
              for pol in ("fcfs", "priority") for asy in (False, True)}
    assert widths == {("fcfs", False): 12, ("fcfs", True): 13, ("priority", False): 15, ("priority", True): 15}


def test_waiting_is_ordered_by_priority_arrival_and_id():
    st = SchedState.new(InstanceConfig(num_kv_blocks=64, scheduling_policy="priority"), capacity=8)
    for rid, prio, arrival in ((0, 2, 1), (1, 0, 3), (2, 2, 0), (3, 0, 3), (4, -1, 9), (5, 2, 1)):
        st.add(rid, 10, 2, priority=prio, arrival=arrival)
    assert st.rids(st.waiting_slots()) == [4, 1, 3, 2, 0, 5]


def test_regenerated_priority_fixtures_match_the_committed_ones(tmp_path: Path):
    """vLLM's real scheduler under the priority policy, rerun now, gives the
    committed priority fixtures byte for byte (needs vLLM's environment:
    ``LATROUTE_VLLM_PYTHON``)."""
    python = os.environ.get("LATROUTE_VLLM_PYTHON")
    if not python:
        pytest.skip("LATROUTE_VLLM_PYTHON not set (the Python of an environment with vLLM 0.32)")
    status, err = releases.regenerate(python, tmp_path, mode="priority")
    assert status == 0, err
    subs = (releases.PRIORITY, f"{releases.PRIORITY}/async")
    assert releases.changed_files(releases.KERNEL_VERSION, tmp_path, subs, random=False) == []
