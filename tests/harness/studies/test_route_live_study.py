"""The live study's pure parts: rankings, Kendall's tau, the repeats'
intervals and the verdict; the CPU workload; a live run scored exactly as
replay scores the twin; the route fields loadgen sends and the proxy reads
back. The live run itself (``latroute serve`` backends) is behind ``docs``."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from harness.route.inputs import request_headers, stated
from harness.studies.live_workload import cpu_workload, measured_ontime, task_accuracy
from harness.studies.rank_agreement import (
    Interval,
    disagreements,
    interval,
    kendall_tau,
    ranking,
    relative_error,
    t975,
    verdict,
)
from harness.studies.route_live import POOL_FILE, run_order
from harness.twin.pools.spec import load_pool

ACC = {"alpaca": {"a": 0.5, "b": 0.8}, "hotpotqa": {"a": 0.3, "b": 0.9}}


def test_kendall_tau_counts_pairs_and_ties():
    a = {"x": 3.0, "y": 2.0, "z": 1.0}
    assert kendall_tau(a, a) == 1.0
    assert kendall_tau(a, {"x": 1.0, "y": 2.0, "z": 3.0}) == -1.0
    assert kendall_tau(a, {"x": 3.0, "y": 1.0, "z": 2.0}) == pytest.approx(1 / 3)  # one of three pairs swapped
    # a tie in one scoring: tau-b, (C - D) / sqrt((C + D + Ta)(C + D + Tb)) = (2 - 0) / sqrt(2 * 3)
    assert kendall_tau(a, {"x": 3.0, "y": 1.0, "z": 1.0}) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(kendall_tau({"x": 1.0, "y": 1.0}, {"x": 1.0, "y": 1.0}))
    with pytest.raises(ValueError):
        kendall_tau(a, {"x": 1.0})


def test_intervals_from_repeats():
    iv = interval([0.5, 0.6])
    assert iv.mean == pytest.approx(0.55)
    half = 12.706 * np.std([0.5, 0.6], ddof=1) / math.sqrt(2)
    assert (iv.lo, iv.hi) == pytest.approx((0.55 - half, 0.55 + half))
    assert interval([0.4]) == Interval(0.4, 0.4, 0.4, 1)
    assert t975(3) == 3.182 and t975(11) == 2.228 and t975(100) == 1.96  # 11: the table's lower entry (10)
    with pytest.raises(ValueError):
        interval([])
    with pytest.raises(ValueError):
        t975(0)


def test_disagreements_say_whether_the_repeats_separate_the_pair():
    meas = {"a": interval([0.70, 0.71, 0.72]), "b": interval([0.50, 0.51, 0.52]), "c": interval([0.48, 0.52, 0.50])}
    assert ranking({k: v.mean for k, v in meas.items()}) == ["a", "b", "c"]
    # the twin swaps b and c (inside the noise: b's and c's intervals overlap) and a and b (separated)
    pairs = disagreements(meas, {"a": 0.6, "b": 0.62, "c": 0.64})
    got = {(p.better_measured, p.worse_measured): p.separated for p in pairs}
    assert got == {("a", "b"): True, ("a", "c"): True, ("b", "c"): False}
    v = verdict(meas, {"a": 0.70, "b": 0.50, "c": 0.52}, tolerance=0.15)
    assert v["disagreements"][0]["better_measured"] == "b" and not v["disagreements"][0]["separated"]
    assert v["rankings_agree_within_noise"] and v["all_within_tolerance"]
    assert v["kendall_tau"] == pytest.approx(1 / 3)
    v = verdict(meas, {"a": 0.50, "b": 0.51, "c": 0.52}, tolerance=0.15)
    assert not v["rankings_agree_within_noise"] and not v["within_tolerance"]["a"]  # a: -29%
    assert relative_error(0.5, 0.4) == pytest.approx(0.25) and relative_error(0.0, 0.0) == 0.0


def test_run_order_is_seeded_and_covers_every_router_per_repeat():
    routers = ["r1", "r2", "r3", "r4"]
    order = run_order(routers, 3, seed=7)
    assert order == run_order(routers, 3, seed=7)
    for rep in range(3):
        assert sorted(r for k, r in order if k == rep) == routers
    assert len({tuple(r for k, r in order if k == rep) for rep in range(3)}) > 1  # orders differ between repeats


def test_cpu_workload_is_deterministic_and_draws_accuracy_by_task():
    req, q = cpu_workload(2000, 3.0, 5, ACC, slo_scale=4.0)
    req2, q2 = cpu_workload(2000, 3.0, 5, ACC, slo_scale=4.0)
    pd.testing.assert_frame_equal(req, req2)
    pd.testing.assert_frame_equal(q, q2)
    assert req["prompt_tokens"].between(8, 2000).all() and req["output_tokens"].between(1, 400).all()
    assert 2000 / req["arrival_s"].iloc[-1] == pytest.approx(3.0, rel=0.1)
    assert (req["slo_ttft_s"] >= 4 * 0.150 - 1e-12).all() and (req["slo_ttft_s"] <= 4 * 1.120 + 1e-12).all()
    m = q.merge(req[["request_id", "task"]], on="request_id").groupby(["task", "model"])["acc"].mean()
    for task, row in ACC.items():
        for model, mean in row.items():
            assert m[(task, model)] == pytest.approx(mean, abs=0.04)


def test_task_accuracy_refuses_a_partial_table():
    assert task_accuracy({"accuracy": ACC}, ["a", "b"]) == ACC
    with pytest.raises(ValueError, match="model c"):
        task_accuracy({"accuracy": ACC}, ["a", "c"])
    with pytest.raises(ValueError, match="no accuracy table"):
        task_accuracy({}, ["a"])
    pool = load_pool(POOL_FILE)  # the shipped pool: tiny-a the cheaper and weaker in every task
    acc = task_accuracy(pool.notes, [c.model for c in pool.instances])
    a, b = pool.instances
    assert a.price_in < b.price_in and a.price_out < b.price_out
    assert all(row["tiny-a"] < row["tiny-b"] for row in acc.values())


def test_measured_ontime_scores_a_run_as_replay_scores_the_twin(tmp_path):
    """Feed replay's own served table (instance, TTFT) to the live scoring:
    the same OnTimeUtility and SLO attainment, to the last bit of a sum."""
    from harness.twin.replay import ReplayConfig, replay

    pool = load_pool("qwen3-h100")
    models = [c.model for c in pool.instances]
    acc = {"alpaca": {m: v for m, v in zip(models, (0.5, 0.8, 0.9))}}
    req, q = cpu_workload(300, 6.0, 1, acc)
    res = replay(pool, "qwen3-h100", req, q, ReplayConfig(router="sfs-hard", seed=0))
    served = res.requests[["request_id", "instance_id", "ttft_s"]]
    got = measured_ontime(req, q, models, [c.instance_id for c in pool.instances],
                          [c.price_in for c in pool.instances], [c.price_out for c in pool.instances], served)
    assert got["ontime_utility"] == pytest.approx(res.metrics["ontime_utility"], rel=1e-12)
    assert got["slo_attainment"] == pytest.approx(res.metrics["slo_attainment"])
    # a request the run lost (no row) is late, as an unserved one is in the twin
    lost = measured_ontime(req, q, models, [c.instance_id for c in pool.instances],
                           [c.price_in for c in pool.instances], [c.price_out for c in pool.instances],
                           served.iloc[1:])
    assert lost["failed"] == 1 and lost["slo_attainment"] <= got["slo_attainment"]


def test_route_fields_round_trip_through_the_proxys_reader(tmp_path):
    from harness.live.route_fields import route_fields
    from harness.studies.route_live import write_trace
    from traces.store import open_trace

    req, q = cpu_workload(20, 3.0, 2, ACC)
    t = open_trace(write_trace(req, q, tmp_path / "wl", {}))
    heads = route_fields(t, req["request_id"].to_numpy()[::-1])
    for h, (_, row) in zip(heads, req.iloc[::-1].iterrows()):
        s = stated(h, {})
        assert s.slo_s == pytest.approx(row["slo_ttft_s"], abs=1e-9)
        assert s.predicted == row["predicted_output_tokens"]
        want = q[q["request_id"] == row["request_id"]].set_index("model")["acc_hat"].to_dict()
        assert s.quality == want  # the very floats
    assert request_headers(None, None, None) == {}
    json.dumps(heads)  # plain strings, sendable


def _study(args: list[str], out) -> None:
    """``latroute study route-live ARGS`` as a user runs it (its own process: it starts servers)."""
    r = subprocess.run([sys.executable, "-m", "harness.cli", "study", "route-live", args[0], str(out), *args[1:]],
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    print(r.stdout)


@pytest.mark.docs
def test_live_study_on_serve_backends(tmp_path, capsys):
    """Two routers through the proxy on ``latroute serve`` (qwen3-h100, speed
    2): every request served; round robin's shares are its arrival order's,
    measured and predicted alike; the report ranks both and gives tau."""
    pytest.importorskip("aiohttp")
    _study(["serve", "--pool", "qwen3-h100", "--requests", "40", "--rate", "4", "--speed", "2", "--routers",
            "round-robin,sfs-cc", "--repeats", "1", "--twin-seeds", "1", "--views", "ledger"], tmp_path)
    res = json.loads((tmp_path / "ledger" / "results.json").read_text())
    assert sorted(r["router"] for r in res["runs"]) == ["round-robin", "sfs-cc"]
    assert all(r["failed"] == 0 and r["requests"] == 40 for r in res["runs"])
    rr = next(r for r in res["runs"] if r["router"] == "round-robin")
    assert rr["share_by_instance"] == pytest.approx(res["predicted"]["round-robin"]["share_by_instance"])
    text = capsys.readouterr().out
    assert "Kendall's tau" in text and "measured ranking" in text


@pytest.mark.docs
def test_live_study_on_backends_already_running(tmp_path, capsys):
    """``backends``: the pool file names servers someone else started
    (here one ``latroute serve`` of qwen3-h100 at speed 2); the study
    sends through the proxy to them and predicts with the same pool."""
    pytest.importorskip("aiohttp")
    from harness.live.ports import free_port_base
    from harness.live.processes import start_ready, stop

    base = free_port_base(3)
    doc = load_pool("qwen3-h100").to_json()
    for k, inst in enumerate(doc["instances"]):
        inst["url"] = f"http://127.0.0.1:{base + k}"
    (tmp_path / "pool.json").write_text(json.dumps(doc))
    from tests.conftest import run_cli

    assert run_cli("trace", "generate", "--requests", "40", "--rate", "4", "--seed", "1", "--out",
                   tmp_path / "wl").exit_code == 0
    serve = start_ready(["serve", "--pool", "qwen3-h100", "--port-base", str(base), "--speed", "2"], tmp_path)
    try:
        _study(["backends", "--pool", str(tmp_path / "pool.json"), "--trace", str(tmp_path / "wl"), "--speed", "2",
                "--routers", "round-robin,sfs-cc", "--repeats", "1", "--twin-seeds", "1"], tmp_path / "out")
    finally:
        stop(serve)
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert all(r["failed"] == 0 and r["requests"] == 40 for r in res["runs"])
    assert set(res["predicted"]) == {"round-robin", "sfs-cc"}
    assert "Kendall's tau" in capsys.readouterr().out


@pytest.mark.docs
@pytest.mark.skipif(not os.environ.get("LATROUTE_VLLM_PYTHON"), reason="needs vLLM (LATROUTE_VLLM_PYTHON)")
def test_live_study_on_two_real_vllm_servers(tmp_path):
    """tiny-a and tiny-b, each pinned to a core, 20 requests through the
    proxy with round robin, the exact view reading each server's state
    feed: all served, half each, and both servers recorded them (the
    recording scheduler was on)."""
    _study(["real", "--requests", "20", "--rate", "2", "--routers", "round-robin", "--repeats", "1",
            "--twin-seeds", "1", "--view", "exact"], tmp_path)
    res = json.loads((tmp_path / "results.json").read_text())
    run = res["runs"][0]
    assert run["failed"] == 0 and run["share_by_instance"] == {"tiny-a": 0.5, "tiny-b": 0.5}
    for name in ("tiny-a", "tiny-b"):
        rec = tmp_path / "servers" / "session0" / f"rec-{name}"  # each server session in its own directory
        assert (rec / "requests.csv").is_file()
        assert json.loads((rec / "recorder.json").read_text())["state_feed"]["frames"] > 0  # the exact view read it
