"""Drift in the twin: an instance whose true speed differs from
its profile (``host_speed``), the running speed factor each twin instance
learns from its completed steps, and latency-aware routers that use it
(``--online-speed``)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from estimators.timemodel.online_speed import OnlineSpeedConfig, running_factors, step_log_ratios, steps_to_converge
from harness.twin.pools.spec import load_pool
from harness.twin.replay import ReplayConfig, replay
from harness.twin.simulation import Twin, TwinConfig, shortest_queue_router
from tests.conftest import run_cli
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload


def slow_pool(factor: float):
    pool = load_pool("qwen3-h100")
    insts = tuple(replace(c, host_speed=factor) if c.instance_id == "qwen3-8b" else c for c in pool.instances)
    return replace(pool, instances=insts)


def _run(pool, requests, record_steps=True):
    seen = {}

    def router(i, t, insts):
        seen["insts"] = insts
        return shortest_queue_router(i, t, insts)

    twin = Twin.from_pool(pool, TwinConfig(seed=2, record_steps=record_steps))
    return twin, twin.run(requests, router), seen["insts"]


def test_a_slow_host_runs_slower_and_its_instance_learns_by_how_much():
    wl = generate_workload(WorkloadConfig(requests=1500, arrivals=ArrivalSpec("poisson", 6.0), seed=3))
    _, fast, fast_insts = _run(slow_pool(1.0), wl.requests)
    twin, slow, insts = _run(slow_pool(1.45), wl.requests)
    by_id = {i.instance_id: i for i in insts}
    assert by_id["qwen3-8b"].speed_factor == pytest.approx(1.45, rel=0.03)
    assert by_id["qwen3-0.6b"].speed_factor == pytest.approx(1.0, rel=0.03)
    assert {i.instance_id: i for i in fast_insts}["qwen3-8b"].speed_factor == pytest.approx(1.0, rel=0.03)
    # the twin's rule is estimators.timemodel.online_speed's, applied to the same completed steps
    steps = slow.steps[slow.steps["instance_id"] == "qwen3-8b"]
    prof = twin.specs[[s.instance_id for s in twin.specs].index("qwen3-8b")].profile
    cfg = OnlineSpeedConfig()
    f = running_factors(step_log_ratios(prof, steps, cfg), cfg)
    assert by_id["qwen3-8b"].speed_factor == pytest.approx(f[-1], rel=1e-6)
    assert by_id["qwen3-8b"].speed_steps == len(steps)
    n = steps_to_converge(f, 1.45, 0.05)
    assert n is not None and n < 100, n
    # durations on the slow host really are longer for the same batches
    fs, ss = fast.steps, steps
    assert (ss["end_s"] - ss["start_s"]).median() > 1.3 * (fs[fs["instance_id"] == "qwen3-8b"]["end_s"]
                                                             - fs[fs["instance_id"] == "qwen3-8b"]["start_s"]).median()


def test_online_speed_recovers_what_drift_costs_sfs_hard():
    wl = generate_workload(WorkloadConfig(requests=2500, arrivals=ArrivalSpec("poisson", 8.0), seed=4))
    pool = slow_pool(1.45)
    util = {}
    for online in (False, True):
        res = replay(pool, "slow", wl.requests, wl.quality, ReplayConfig(router="sfs-hard", seed=1,
                                                                         online_speed=online))
        util[online] = res.metrics["slo_attainment"]
        assert res.metrics["online_speed"] is online and res.metrics["host_speed"]["qwen3-8b"] == 1.45
    assert util[True] > util[False] + 0.03, util


def test_host_speed_in_a_pool_file(tmp_path):
    doc = slow_pool(1.45).to_json()
    (tmp_path / "pool.json").write_text(json.dumps(doc))
    res = run_cli("replay", "--pool", tmp_path / "pool.json", "--rate", "6", "--requests", "300", "--router",
                  "sfs-hard", "--online-speed", "on", "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["host_speed"] == {"qwen3-0.6b": 1.0, "qwen3-8b": 1.45, "qwen3-32b": 1.0} and m["online_speed"]
    doc["instances"][1]["host_speed"] = -1
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    bad = run_cli("replay", "--pool", tmp_path / "bad.json", "--rate", "6", "--requests", "30", "--router",
                  "sfs-hard", "--out", tmp_path / "b")
    assert bad.exit_code == 2 and "host_speed" in bad.stderr
    assert np.isfinite(m["ontime_utility"])
