"""Routers on hand-built views, and replay/sweep end to end."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.sweep.driver import auc
from routers.base import RouteInputs
from routers.latency_aware import LatencyAware
from routers.rules import hard_rule, soft_rule
from routers.simple import LatencyAgnostic, PowerOfTwo, RoundRobin, ShortestQueue
from routers.utility import utility_tables
from tests.conftest import run_cli


class View:
    """A stand-in for a twin instance, as routers see it."""

    def __init__(self, residents):
        self.residents = residents


class FixedEstimator:
    """Returns a preset latency per query; counts calls."""

    def __init__(self, lat):
        self.lat = lat
        self.calls = 0

    def estimate(self, snap, q):
        self.calls += 1
        return self.lat


def inputs(utility, slo=0.5):
    u = np.atleast_2d(np.asarray(utility, dtype=float))
    return RouteInputs(np.full(len(u), 100), np.full(len(u), slo), u, np.full(len(u), 10))


def test_hard_rule_with_and_without_a_feasible_instance():
    u = np.array([0.3, 0.9, 0.6])
    assert hard_rule(u, np.array([0.1, 0.2, 0.3]), 0.5) == 1  # all feasible: best utility
    assert hard_rule(u, np.array([0.1, 0.8, 0.3]), 0.5) == 2  # best infeasible: next best feasible
    assert hard_rule(u, np.array([0.9, 0.8, 0.7]), 0.5) == 2  # none feasible: fastest
    assert hard_rule(np.array([0.5, 0.5]), np.array([0.1, 0.1]), 0.5) == 0  # ties: lowest index


def test_soft_rule_and_delta_zero_is_latency_agnostic():
    u = np.array([0.3, 0.9, 0.6])
    lat = np.array([0.01, 2.0, 0.1])  # seconds
    assert soft_rule(u, lat, 0.0) == 1
    assert soft_rule(u, lat, 1e-6) == 2  # scores 0.29, -1.1, 0.5 (1e-6 per us = 1 per second)
    assert soft_rule(u, lat, 1e9) == 0  # pure latency
    views = [View(0), View(0), View(0)]
    rng = np.random.default_rng(0)
    util = rng.random((200, 3))
    agnostic = LatencyAgnostic(inputs(util))
    soft = LatencyAware(inputs(util), [FixedEstimator(1.0)] * 3, "soft", 0.0, "x-soft")
    assert [agnostic(i, 0.0, views) for i in range(200)] == [soft(i, 0.0, views) for i in range(200)]
    assert all(e.calls == 0 for e in soft.estimators)  # delta 0 never asks for a latency


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0.01, 2.0)), min_size=1, max_size=6), st.floats(0.05, 1.5))
def test_lazy_hard_router_decides_like_the_eager_rule(pairs, slo):
    u = np.array([p[0] for p in pairs])
    lat = np.array([p[1] for p in pairs])
    router = LatencyAware(inputs(u, slo), [FixedEstimator(x) for x in lat], "hard", name="x-hard")
    views = [View(0) for _ in pairs]
    assert router(0, 0.0, views) == hard_rule(u, lat, slo)


def test_simple_routers():
    views = [View(5), View(2), View(2)]
    rr = RoundRobin(inputs([[0, 0, 0]] * 4))
    assert [rr(i, 0, views) for i in range(4)] == [0, 1, 2, 0]
    assert ShortestQueue(inputs([[0, 0, 0]]))(0, 0, views) == 1
    p2 = PowerOfTwo(inputs([[0, 0, 0]] * 50), seed=1)
    picks = [p2(i, 0, views) for i in range(50)]
    assert 0 not in picks and {1, 2} <= set(picks)  # the longest queue always loses its pairing
    assert LatencyAgnostic(inputs([[0.1, 0.7, 0.3]]))(0, 0, views) == 1


def test_utility_tables_prices_and_lambda():
    reqs = pd.DataFrame({"request_id": [7, 8], "prompt_tokens": [1000, 10], "output_tokens": [100, 1000],
                         "predicted_output_tokens": [200, 900]})
    q = pd.DataFrame({"request_id": [7, 7, 8, 8], "model": ["a", "b", "a", "b"], "acc": [0.5, 0.9, 0.2, 0.8],
                      "acc_hat": [0.4, 0.8, 0.3, 0.7]})
    t = utility_tables(reqs, q, ["a", "b"], np.array([0.1, 1.0]), np.array([0.2, 2.0]), np.array([200, 900]),
                       lam=1e-3)
    # cost in micro-dollars = tokens * USD per million tokens
    assert t.cost_realised[0].tolist() == pytest.approx([1000 * 0.1 + 100 * 0.2, 1000 * 1.0 + 100 * 2.0])
    assert t.realised[0, 1] == pytest.approx(0.9 - 1e-3 * 1200)
    assert t.predicted[1, 0] == pytest.approx(0.3 - 1e-3 * (10 * 0.1 + 900 * 0.2))


def test_auc_trapezoid():
    assert auc(np.array([3.0, 4.0, 6.0]), np.array([1.0, 1.0, 0.0])) == pytest.approx(1.0 + 1.0)


def test_replay_and_sweep_cli(tmp_path):
    res = run_cli("replay", "--rate", 6, "--requests", 400, "--router", "sfs-hard", "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["requests"] == 400 and 0 < m["ontime_utility"] <= m["mean_utility"] + 1e-12
    assert abs(sum(m["share_by_instance"].values()) - 1) < 1e-9
    served = pd.read_parquet(tmp_path / "r" / "served" / "requests.parquet")
    assert {"instance_id", "ttft_s", "utility", "on_time"} <= set(served.columns)
    assert served["on_time"].mean() == pytest.approx(m["slo_attainment"])
    res = run_cli("sweep", "--rates", "4,7", "--requests", 300, "--routers", "shortest-queue,sfs-hard,sfs-soft",
                  "--deltas", "0,1e-6", "--workers", 2, "--out", tmp_path / "s")
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(tmp_path / "s" / "results.parquet")
    assert len(df) == 2 * (1 + 1 + 2)
    s = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert s["rate_range"] == [4.0, 7.0] and "frontier" in s
    assert s["best_baseline"]["router"] == "shortest-queue"  # the only baseline router in this sweep
    # the same sweep with one worker gives the same numbers (determinism)
    res = run_cli("sweep", "--rates", "4,7", "--requests", 300, "--routers", "shortest-queue,sfs-hard,sfs-soft",
                  "--deltas", "0,1e-6", "--workers", 1, "--out", tmp_path / "s1")
    df1 = pd.read_parquet(tmp_path / "s1" / "results.parquet")
    cols = [c for c in df.columns if c not in ("wall_s", "speedup", "mean_decision_us")]
    pd.testing.assert_frame_equal(df[cols], df1[cols])
    assert run_cli("sweep", "--routers", "nope", "--out", tmp_path / "x").exit_code == 2


def test_registry_declares_what_each_router_needs():
    from estimators.estimate import ESTIMATORS, build
    from estimators.timemodel.profile import load_profile
    from routers.registry import MAIN_ROUTERS, REGISTRY, make_router

    prof = load_profile("qwen3-8b-h100")
    for est in ESTIMATORS:
        for rule in ("hard", "soft"):
            e = REGISTRY[f"{est}-{rule}"]
            assert e.estimator == est and e.rule == rule and e.uses_delta == (rule == "soft") and e.uses_lambda
            # needs_baselines says exactly whether the estimator can be built without them
            if e.needs_baselines:
                with pytest.raises(ValueError, match="baseline"):
                    build(est, prof, None, np.ones(1, dtype=np.int64), 0.0)
            else:
                build(est, prof, None, np.ones(1, dtype=np.int64), 0.0)
    simple = [e for e in REGISTRY.values() if e.estimator is None]
    assert not any(e.uses_delta or e.needs_baselines for e in simple)
    assert [n for n, e in REGISTRY.items() if e.oracle] == ["oracle"]
    assert [n for n, e in REGISTRY.items() if e.uses_lambda and e.estimator is None] == ["latency-agnostic", "oracle"]
    assert [n for n, e in REGISTRY.items() if e.uses_epsilon] == ["sfs-cc", "throughput-cc", "learned-cc"]
    assert MAIN_ROUTERS == ("shortest-queue", "latency-agnostic", "sfs-hard", "sfs-soft", "sfs-cc", "sfs-eu")
    assert {n for n, e in REGISTRY.items() if e.baseline} == {"round-robin", "shortest-queue", "latency-agnostic"}
    # a router built through the registry ignores delta unless it declares it
    specs = [type("Spec", (), {"profile": prof, "instance_id": f"i{k}"})() for k in range(2)]
    for name in ("sfs-hard", "sfs-soft"):
        r = make_router(name, inputs(np.array([[0.9, 0.1]])), specs, 0.0, delta_per_us=1e9)
        assert r.delta == (1e9 if REGISTRY[name].uses_delta else 0.0)
