"""Chance-constrained and expected-utility routers, and the oracle's fork."""
import math

import numpy as np
import pandas as pd

from harness.twin.pools.spec import load_pool
from harness.twin.replay import ReplayConfig, replay
from routers.base import RouteInputs
from routers.chance import ChanceRouter, LognormalError
from routers.oracle import Oracle
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload


class _Fixed:
    """An estimator whose estimate is fixed per instance (the rules' inputs)."""

    name = "fixed"

    def __init__(self, value):
        self.value = value

    def estimate(self, view, q):
        return self.value


def _router(rule, values, utility, slo=1.0, sigma=0.3, eps=0.1):
    inputs = RouteInputs(np.array([10]), np.array([slo]), np.array([utility]), np.array([5]))
    ests = [LognormalError(_Fixed(v), 0.0, sigma) for v in values]
    return ChanceRouter(inputs, ests, rule, eps)


def test_chance_constraint_and_expected_utility():
    # P(on time) with sigma 0.3: est 0.5 -> 0.99, est 0.8 -> 0.77, est 1.0 -> 0.5
    assert _router("cc", [0.5, 0.8, 1.0], [0.1, 0.5, 0.9])(0, 0.0, [None] * 3) == 0  # only 0 has P >= 0.9
    assert _router("cc", [0.5, 0.8, 1.0], [0.1, 0.5, 0.9], eps=0.3)(0, 0.0, [None] * 3) == 1
    assert _router("cc", [2.0, 1.5, 3.0], [0.9, 0.5, 0.1])(0, 0.0, [None] * 3) == 1  # none: the likeliest
    # expected on-time utility: 0.1*0.99, 0.5*0.77, 0.9*0.5 -> instance 2
    assert _router("eu", [0.5, 0.8, 1.0], [0.1, 0.5, 0.9])(0, 0.0, [None] * 3) == 2
    assert _router("eu", [9.0, 8.0], [0.9, 0.1], sigma=0.01)(0, 0.0, [None] * 2) == 1  # all hopeless: fastest


def _workload(n=300, rate=9.0, seed=3):
    return generate_workload(WorkloadConfig(requests=n, arrivals=ArrivalSpec("poisson", rate), seed=seed)).requests


def test_oracle_fork_predicts_the_true_ttft():
    """Where no later arrival joins the chosen instance before the query's
    first token, the fork's TTFT is exactly the realised one."""
    wl = _workload()
    pool = load_pool("qwen3-h100")
    seen = {}

    class Recording(Oracle):
        def choose(self, i, t, insts):
            j = super().choose(i, t, insts)
            seen[i] = (j, self.true_ttft(insts[j], i, t, 3600.0))
            return j

    from harness.twin.simulation import Twin, TwinConfig
    specs = Twin.from_pool(pool).specs
    inputs = RouteInputs(wl["prompt_tokens"].to_numpy(), np.full(len(wl), 2.0), np.zeros((len(wl), len(specs))),
                         wl["output_tokens"].to_numpy())
    router = Recording(inputs, wl["output_tokens"].to_numpy(), pool.frontend_overhead_s)
    res = Twin.from_pool(pool, TwinConfig(seed=5, record_steps=False)).run(wl, router)
    out = res.requests
    first = out["arrival_s"] + out["ttft_s"] - pool.frontend_overhead_s
    inst = out["instance_id"].to_numpy()
    arrival = out["arrival_s"].to_numpy()
    exact = 0
    for i, (_j, pred) in seen.items():
        later = (arrival > arrival[i]) & (arrival < first[i]) & (inst == inst[i])
        if not later.any() and math.isfinite(pred):
            assert abs(pred - out["ttft_s"].iloc[i]) < 1e-9, i
            exact += 1
    assert exact > 50


def test_oracle_and_chance_replays_are_deterministic():
    wl = _workload(200)
    pool = load_pool("qwen3-h100")
    for router in ("oracle", "sfs-cc"):
        a, b = (replay(pool, "qwen3-h100", wl, None, ReplayConfig(router=router, seed=2)) for _ in range(2))
        pd.testing.assert_frame_equal(a.requests, b.requests)
        assert a.metrics["oracle"] == (router == "oracle")


def test_sweep_reports_oracle_share_and_best_other():
    from harness.sweep.driver import summarize_sweep
    rows = []
    for seed in (0, 1):
        for router, level in (("oracle", 1.0), ("sfs-cc", 0.9), ("sfs-hard", 0.8), ("latency-agnostic", 0.5)):
            for rate in (3.0, 9.0):
                rows.append({"lam": 5e-4, "router": router, "delta_per_us": 0.0, "rate": rate, "seed": seed,
                             "ontime_utility": level + 0.01 * seed, "slo_attainment": 1.0, "ttft_mean_s": 0.1,
                             "mean_utility": level})
    s = summarize_sweep(pd.DataFrame(rows))
    r = s["routers"]
    assert s["oracle"]["router"] == "oracle"
    assert abs(r["sfs-cc"]["oracle_share"] - (0.905 / 1.005)) < 1e-9
    assert r["sfs-cc"]["best_other"]["router"] == "sfs-hard"  # the oracle is never the "other" router
    assert r["sfs-hard"]["best_other"]["router"] == "sfs-cc" and "best_other" not in r["oracle"]
    assert s["best_baseline"]["router"] == "latency-agnostic"
