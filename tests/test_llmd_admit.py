"""``llmd-admit``: llm-d's latency-slo-admitter in front of
``llmd-headroom``, and shedding in the twin -- the admission rule on
hand-built endpoints, a shed request's outcome in every metric, determinism,
and that the admitter never changes which instance an admitted request gets."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from harness.twin.simulation import Twin, TwinConfig
from routers.base import SHED, RouteInputs, Router
from routers.llmd_admit import COLD_KV, admits, sheddable_flags
from routers.registry import REGISTRY


def _overloaded(n=3):
    """Every endpoint predicted late, busy and warm: the one case llm-d sheds."""
    return dict(headroom=np.full(n, -0.5), predicted=np.ones(n, dtype=bool), running=np.full(n, 4.0),
                kv=np.full(n, 0.5))


def test_sheds_only_when_no_endpoint_is_valid_idle_or_cold():
    assert not admits(True, 1.0, **_overloaded())
    for name, value in (("headroom", 0.0), ("running", 0.0), ("kv", COLD_KV / 2)):  # one endpoint is enough
        e = _overloaded()
        e[name][1] = value
        assert admits(True, 1.0, **e), name
    e = _overloaded()
    e["kv"][:] = COLD_KV  # 2% exactly is warm
    assert not admits(True, 1.0, **e)


def test_a_late_endpoint_without_a_prediction_is_not_valid_and_none_fails_open():
    e = _overloaded()
    e["headroom"][0], e["predicted"][0] = 0.3, False  # its headroom is the cold start's, not a prediction
    assert not admits(True, 1.0, **e)
    e["predicted"][:] = False  # no endpoint has a prediction: fail-open
    assert admits(True, 1.0, **e)


def test_non_sheddable_requests_and_requests_without_an_slo_pass():
    assert admits(False, 1.0, **_overloaded())
    assert admits(True, math.inf, **_overloaded()) and admits(True, 0.0, **_overloaded())


def test_sheddable_share():
    assert sheddable_flags(5, 1.0, 3).all() and not sheddable_flags(5, 0.0, 3).any()
    a = sheddable_flags(10_000, 0.3, 7)
    assert (a == sheddable_flags(10_000, 0.3, 7)).all() and not (a == sheddable_flags(10_000, 0.3, 8)).all()
    assert 0.28 < a.mean() < 0.32
    with pytest.raises(ValueError, match="sheddable share"):
        sheddable_flags(5, 1.5, 0)


def test_registry_entry_declares_what_it_needs():
    e = REGISTRY["llmd-admit"]
    assert e.estimator == "learned" and e.needs_baselines and e.seeded and e.sheds and e.uses_lambda
    assert not e.oracle and not e.main and not e.uses_delta
    assert e.capabilities()["sheds"] is True
    assert [n for n, x in REGISTRY.items() if x.sheds] == ["llmd-admit"]
    assert "sheds" not in REGISTRY["llmd-headroom"].capabilities()  # results of other routers keep their keys


class _EveryOther(Router):
    """Sheds odd requests, sends the rest to instance 0."""

    sheds = True

    def choose(self, i, t, insts):
        return SHED if i % 2 else 0


def _tiny_twin():
    from estimators.engine.config import InstanceConfig
    from estimators.timemodel.fit import NoiseModel
    from estimators.timemodel.profile import BatchTimeProfile
    from harness.twin.simulation import InstanceSpec

    prof = BatchTimeProfile("t", "eq9", np.array([1e-3, 1e-6, 0.0, 0.0]), NoiseModel(log_sigma=0.01))
    spec = InstanceSpec(InstanceConfig(instance_id="a", max_num_batched_tokens=256, max_num_seqs=8, num_kv_blocks=100,
                                       max_model_len=1024), prof)
    reqs = pd.DataFrame({"request_id": [0, 1, 2, 3], "arrival_s": [0.0, 0.01, 0.02, 0.03],
                         "prompt_tokens": [50] * 4, "output_tokens": [3] * 4})
    inputs = RouteInputs(np.full(4, 50), np.ones(4), np.zeros((4, 1)), np.full(4, 3))
    return Twin([spec], TwinConfig(record_steps=False)), reqs, inputs


def test_the_twin_sheds_only_for_a_router_that_says_so():
    twin, reqs, inputs = _tiny_twin()
    res = twin.run(reqs, _EveryOther(inputs))
    r = res.requests
    assert res.extra["shed"] == 2 and r["instance_id"].isna().tolist() == [False, True, False, True]
    assert r.loc[[1, 3], "ttft_s"].isna().all() and r.loc[[0, 2], "ttft_s"].notna().all()
    _EveryOther.sheds = False  # a router that does not declare it: -1 is a bug, not a shed
    try:
        with pytest.raises(ValueError, match="router returned instance -1"):
            twin.run(reqs, _EveryOther(inputs))
    finally:
        _EveryOther.sheds = True


# --- replays over the learned model (LightGBM) ---

def _hand_baselines(pool_ref):
    """The cold start's parameters by hand: the pool's calibration replay is not what is tested here."""
    from estimators.estimate import BaselineParams
    from harness.twin.pools.spec import load_pool

    return {c.instance_id: BaselineParams(2e4, 0.01, 8, 1.0, 1.0, 1.0, 0.01, 0.01, 0.0, 0.3)
            for c in load_pool(pool_ref).instances}


@pytest.fixture
def hand_baselines(monkeypatch):
    pytest.importorskip("lightgbm")
    import harness.twin.replay as rp

    monkeypatch.setattr(rp, "pool_baselines", _hand_baselines)


def _replay(tmp_path, name, router="llmd-admit", rate="40", n="500", *extra):
    from tests.conftest import run_cli

    out = tmp_path / name
    r = run_cli("replay", "--pool", "qwen3-h100", "--rate", rate, "--requests", n, "--router", router, *extra,
                "--out", out)
    assert r.exit_code == 0, r.output
    return out, r.output, json.loads((out / "metrics.json").read_text())


def test_at_overload_shed_requests_score_zero_and_miss(tmp_path, hand_baselines):
    out, text, m = _replay(tmp_path, "a")
    req = pd.read_parquet(out / "served" / "requests.parquet")
    shed = req["instance_id"].isna().to_numpy()
    assert 0 < shed.sum() < len(req) and m["shed"] == int(shed.sum()) and m["shed_share"] == shed.mean()
    assert f"shed {m['shed']:,} of 500 requests" in text
    s = req[shed]
    assert (s["utility"] == 0).all() and (s["cost_micro_usd"] == 0).all() and not s["on_time"].any()
    assert s["ttft_s"].isna().all() and s["finish_s"].isna().all()
    assert m["ontime_utility"] == pytest.approx(float((req["utility"] * req["on_time"]).sum() / len(req)), abs=1e-15)
    assert m["slo_attainment"] == float(req["on_time"].mean()) and m["unserved"] >= m["shed"]
    assert sum(m["share_by_instance"].values()) == pytest.approx(1.0 - m["shed_share"])
    assert m["router_capabilities"]["llmd-admit"]["sheds"] is True
    b, _, mb = _replay(tmp_path, "b")  # same seed: the same bytes
    assert (out / "served" / "requests.parquet").read_bytes() == (b / "served" / "requests.parquet").read_bytes()
    timing = ("wall_s", "warmup_s", "speedup", "mean_decision_us", "command")
    assert {k: v for k, v in m.items() if k not in timing} == {k: v for k, v in mb.items() if k not in timing}


def test_validate_and_estimate_take_a_served_trace_with_shed_requests(tmp_path, hand_baselines):
    """The shed requests never entered an instance: validate sheds them
    again and compares the served ones; estimate scores the served ones."""
    from tests.conftest import run_cli

    out, _, m = _replay(tmp_path, "a", "llmd-admit", "40", "300", "--record-steps")
    assert m["shed"] > 0
    r = run_cli("validate", out / "served", "--profile", "qwen3-8b-h100", "--out", tmp_path / "v")
    assert r.exit_code == 0, r.output
    v = json.loads((tmp_path / "v" / "metrics.json").read_text())
    assert v["requests"] == 300 and v["ttft"]["n"] == 300 - m["shed"] - m["rejected"]
    r = run_cli("estimate", out / "served", "--calibrate-on", out / "served", "--out", tmp_path / "e")
    assert r.exit_code == 0, r.output


def test_a_sweep_over_llmd_admit_aggregates_its_sheds(tmp_path, hand_baselines):
    from tests.conftest import run_cli

    r = run_cli("sweep", "--pool", "qwen3-h100", "--routers", "llmd-admit,shortest-queue", "--rates", "10,40",
                "--requests", "500", "--workers", "1", "--out", tmp_path / "s")
    assert r.exit_code == 0, r.output
    df = pd.read_parquet(tmp_path / "s" / "results.parquet")
    adm = df[df["router"] == "llmd-admit"]
    assert (adm["shed"] > 0).any() and df.loc[df["router"] == "shortest-queue", "shed"].isna().all()
    s = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert math.isfinite(s["routers"]["llmd-admit"]["auc_ontime_utility"])


def test_the_admitter_never_changes_the_pick_of_llmd_headroom():
    """With no request sheddable, llmd-admit is llmd-headroom to the byte
    (same predictions, same picker draws): it only sheds."""
    pytest.importorskip("lightgbm")
    from harness.twin.pools.spec import load_pool
    from harness.twin.replay import ReplayConfig, workload_inputs
    from routers.llmd_admit import LlmdAdmit
    from routers.registry import make_router
    from traces.workload.arrivals import ArrivalSpec
    from traces.workload.generator import WorkloadConfig, generate_workload

    pool = load_pool("qwen3-h100-x8")
    wl = generate_workload(WorkloadConfig(requests=300, arrivals=ArrivalSpec("poisson", 48.0), seed=0))
    base = _hand_baselines("qwen3-h100-x8")
    outs = []
    for sheddable in (None, 0.0):
        twin = Twin.from_pool(pool, TwinConfig(seed=1, record_steps=False))
        w = workload_inputs(wl.requests, wl.quality, twin.specs, ReplayConfig(router="llmd-headroom", seed=1))
        r = make_router("llmd-headroom", w.route, twin.specs, pool.frontend_overhead_s, seed=1, baselines=base)
        if sheddable is not None:  # the same estimators, behind the admitter
            r = LlmdAdmit(w.route, r.estimators, [s.model for s in twin.specs], 1, sheddable=sheddable,
                          overhead_s=pool.frontend_overhead_s)
        outs.append(twin.run(wl.requests, r, predicted=w.lengths.tokens).requests)
    assert outs[0].to_json() == outs[1].to_json() and outs[1]["instance_id"].notna().all()
