"""sfs-cc's fast paths (``SFS.estimate_p``: the estimate and its P(on time)
in one compiled call, on a copy of only the rows the simulation reaches) decide exactly as the two calls do: per request the
same instance, the same estimate and P(on time) of it, the same served
requests to the byte, on replicas and on the paper's pool, for every tie
policy, twin noise on and off."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from estimators.estimate import build
from estimators.snapshot import Query
from harness.twin.pools.spec import load_pool
from harness.twin.replay import ReplayConfig, workload_inputs
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig
from routers.base import Router
from routers.chance import DEFAULT_EPSILON, ChanceRouter
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload


class Recorded(ChanceRouter):
    """Keeps, per decision, the instance chosen and its estimate and P(on time)."""

    def choose(self, i, t, insts) -> int:
        j = super().choose(i, t, insts)
        self.log.append((i, j, float(self.latency[j]), float(self.p[j])))
        return j


def _run(pool_ref: str, rate: float, n: int, ties: str, noise: bool, fast: bool, seed: int = 0, rule: str = "cc"):
    pool = load_pool(pool_ref)
    wl = generate_workload(WorkloadConfig(requests=n, arrivals=ArrivalSpec("poisson", rate), seed=seed))
    specs = [InstanceSpec.from_config(c) for c in pool.instances]
    inputs = workload_inputs(wl.requests, wl.quality, specs, ReplayConfig(seed=seed))
    ests = [build("sfs", s.profile, None, inputs.route.pred_total, pool.frontend_overhead_s, online_lps=True)
            for s in specs]
    models = [str(getattr(s, "model", None) or s.instance_id) for s in specs]
    r = Recorded(inputs.route, ests, rule, DEFAULT_EPSILON, name=f"sfs-{rule}", models=models, ties=ties, seed=seed,
                 fast=fast)
    r.log = []
    twin = Twin.from_pool(pool, TwinConfig(seed=seed, record_steps=False, noise=noise))
    res = twin.run(wl.requests, r, predicted=inputs.route.pred_total)
    served = res.requests[["request_id", "instance_id", "ttft_s"]].to_numpy()
    return r.log, hashlib.sha256(repr(served.tolist()).encode()).hexdigest()


@pytest.mark.parametrize("ties", ["lowest-index", "least-latency", "random"])
@pytest.mark.parametrize("noise", [True, False])
def test_fast_chance_decisions_equal_the_two_calls_on_replicas(ties, noise):
    fast = _run("qwen3-h100-x8", 64.0, 500, ties, noise, True)
    slow = _run("qwen3-h100-x8", 64.0, 500, ties, noise, False)
    assert len(fast[0]) == 500
    assert fast[0] == slow[0]
    assert fast[1] == slow[1]


@pytest.mark.parametrize("noise", [True, False])
def test_fast_chance_decisions_equal_the_two_calls_on_the_paper_pool(noise):
    fast = _run("qwen3-h100", 9.0, 600, "lowest-index", noise, True)
    slow = _run("qwen3-h100", 9.0, 600, "lowest-index", noise, False)
    assert fast == slow


@pytest.mark.parametrize("ties", ["lowest-index", "least-latency", "random"])
def test_fast_expected_utility_rule_equals_the_two_calls(ties):
    """sfs-eu asks every instance through the same path."""
    fast = _run("qwen3-h100-x8", 64.0, 300, ties, True, True, rule="eu")
    assert fast == _run("qwen3-h100-x8", 64.0, 300, ties, True, False, rule="eu")


def test_p_on_time_without_the_runtime_is_the_distributions():
    """``sfs_dist.sfs_p_on_time`` (scratch rows, no allocation) gives
    ``sfs_ttft_dist``'s P(on time) to the bit: in-flight steps long past
    their expected end, no simulated step, stalls, a refused estimate."""
    from estimators.sfs.dist import SCRATCH_COLS, SCRATCH_ROWS, NoiseMoments, as_array, sfs_p_on_time, sfs_ttft_dist
    from estimators.timemodel.step_correlation import GRID

    rng = np.random.default_rng(5)
    cv = np.linspace(0.02, 0.001, GRID.size)
    models = [NoiseMoments(1.0043, 1.0013, 2.5e-3, 1e-3, 3.0, 9.0, 0.0, 0.05, tuple(np.linspace(1, 5, 8))),
              NoiseMoments(1.2, 1.02, 0.04, 0.08, 2.5, 8.0, -0.01, 0.2, tuple(np.linspace(0.5, 6, 8))),
              NoiseMoments(1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, tuple(np.zeros(8)))]
    buf, out = np.full((SCRATCH_ROWS, SCRATCH_COLS), np.nan), np.zeros(5)
    n_cases = 0
    for nm in map(as_array, models):
        for _ in range(400):
            n = int(rng.choice([0, 1, 2, 7, 60]))
            typ = rng.uniform(0.001, 0.2, n)
            s1, s2 = float(typ.sum()), float((typ * typ).sum())
            typ0 = float(rng.choice([0.0, rng.uniform(0.001, 0.1)]))
            elapsed = float(rng.choice([0.0, rng.uniform(0, 0.05), rng.uniform(1.0, 50.0)])) if typ0 > 0 else 0.0
            mult = float(rng.uniform(1.0, 1.3))
            total = float(rng.choice([np.inf, rng.uniform(0.0, 0.02) + mult * s1 + rng.uniform(0, 0.05)]))
            for slo in (0.01, total, total * 0.97 if np.isfinite(total) else 1.0, 2.0):
                c = float(rng.choice([1.0, 1.07]))
                sfs_ttft_dist(total, s1, s2, n, mult, c, nm, cv, typ0, elapsed, slo, False, out)
                assert sfs_p_on_time(total, s1, s2, n, mult, c, nm, cv, typ0, elapsed, slo, buf) == out[4]
                n_cases += 1
    assert n_cases == 3 * 400 * 4


def test_estimate_p_leaves_what_estimate_and_p_on_time_leave():
    """Also with junk in the scratch state's rows and free list:
    ``estimate_p`` copies only the rows its simulation reaches and no free
    slot but the query's (``estimators.sfs.kernel.copy_state``'s ``live``)."""
    pool = load_pool("qwen3-h100")
    wl = generate_workload(WorkloadConfig(requests=300, arrivals=ArrivalSpec("poisson", 9.0), seed=2))
    specs = [InstanceSpec.from_config(c) for c in pool.instances]
    inputs = workload_inputs(wl.requests, wl.quality, specs, ReplayConfig(seed=2))
    a, b = (build("sfs", specs[0].profile, None, inputs.route.pred_total, pool.frontend_overhead_s, online_lps=True)
            for _ in range(2))
    twin = Twin.from_pool(pool, TwinConfig(seed=2, record_steps=False))

    class Probe(Router):
        def choose(self, i, t, insts):
            prompt = int(inputs.route.prompt[i])
            seen.append(insts[0].residents)
            for k, slo in enumerate((0.05, 0.5, float(inputs.route.slo[i]))):
                if a.cap > 0:  # junk in the scratch rows: only the rows the simulation reaches are copied
                    a.st2c.req[:] = (-1, 7, 1 << 40)[k]
                    a.st2c.free_slots[:] = (-1, 0, 1)[k]  # nor the free list below the query's slot
                p = a.estimate_p(insts[0], i, t, prompt, slo)
                b.estimate(insts[0], Query(i, t, prompt))
                assert p == b.p_on_time(slo)
                assert (a.last_est, a.last_steps, a.last_s1, a.last_s2) == (b.last_est, b.last_steps, b.last_s1,
                                                                          b.last_s2)
                assert a.last_dist(slo) == b.last_dist(slo)
            return 0

    seen: list[int] = []
    probe = Probe(inputs.route)
    twin.run(wl.requests, probe, predicted=inputs.route.pred_total)
    assert np.isfinite(a.last_est)
    assert len(seen) == 300 and max(seen) >= 20  # every request to one instance: a queue builds


def _toy_run(caching: bool, ties: str, noise: bool, fast: bool):
    """12 toy instances (three models of four replicas, tight KV and batch
    limits so queues, preemption and refused prompts occur; with ``caching``
    every other instance has prefix caching: the two-call path there). At
    700 q/s the walk estimates ~3.7 replicas per decision and ~90 of the 600
    decisions fall back to the likeliest instance."""
    from harness.twin.simulation import Twin, TwinConfig
    from routers.base import RouteInputs
    from tests.harness.twin.loop.test_fleet_loop import toy_requests, toy_specs

    specs = toy_specs(12, caching=caching)
    reqs = toy_requests(600, 700.0, 4)
    n = len(reqs)
    rng = np.random.default_rng(4)
    utility = np.repeat(rng.uniform(0, 1, (n, 3)), 4, axis=1).reshape(n, 3, 4).transpose(0, 2, 1).reshape(n, 12)
    inputs = RouteInputs(reqs["prompt_tokens"].to_numpy(), rng.uniform(0.003, 0.3, n), utility,
                         reqs["output_tokens"].to_numpy() + rng.integers(-20, 20, n).clip(0))
    ests = [build("sfs", s.profile, None, inputs.pred_total, 0.0, online_lps=True) for s in specs]
    r = Recorded(inputs, ests, "cc", DEFAULT_EPSILON, name="sfs-cc", models=[s.config.model for s in specs],
                 ties=ties, seed=3, fast=fast)
    r.log = []
    res = Twin(specs, TwinConfig(seed=7, noise=noise)).run(reqs, r, predicted=inputs.pred_total)
    served = res.requests[["request_id", "instance_id", "ttft_s"]].to_numpy()
    return r.log, hashlib.sha256(repr(served.tolist()).encode()).hexdigest()


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("ties", ["lowest-index", "least-latency", "random"])
@pytest.mark.parametrize("noise", [True, False])
def test_fast_chance_decisions_equal_the_two_calls_on_toy_replicas(caching, ties, noise):
    fast = _toy_run(caching, ties, noise, True)
    assert len(fast[0]) == 600 and len({j for _, j, _, _ in fast[0]}) > 6
    assert fast == _toy_run(caching, ties, noise, False)
