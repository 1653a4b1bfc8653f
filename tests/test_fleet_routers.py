"""Two-level routing over replicas (``routers.fleet``): the tie policies,
byte identity with the one-level walk, exact pruning and the bound behind it."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from estimators.snapshot import Query
from harness.twin.pools.spec import load_pool
from harness.twin.replay import ReplayConfig, replay, workload_inputs
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig
from routers.base import RouteInputs
from routers.chance import ChanceRouter
from routers.fleet import TIE_POLICIES, ModelGroups, TieBreaker
from routers.latency_aware import LatencyAware
from routers.registry import make_router
from routers.rules import hard_rule
from routers.simple import ShortestQueue
from tests.conftest import run_cli
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload


class OneLevelHard(LatencyAware):
    """Main's hard rule at 8d9f8d7, verbatim: instances by (-utility, index),
    the first meeting the SLO, else the fastest (the reference)."""

    def choose(self, i, t, insts) -> int:
        u = self.inputs.utility[i]
        slo = float(self.inputs.slo[i])
        order = sorted(range(len(insts)), key=lambda j: (-u[j], j))
        self.latency[:] = np.inf
        for j in order:
            self.latency[j] = self.estimate_one(j, i, t, insts)
            if self.latency[j] <= slo:
                return j
        return hard_rule(u, self.latency, slo)


class OneLevelCC(ChanceRouter):
    """Main's chance-constrained rule at 8d9f8d7, verbatim."""

    def choose(self, i, t, insts) -> int:
        u = self.inputs.utility[i]
        slo = float(self.inputs.slo[i])
        order = sorted(range(len(insts)), key=lambda j: (-u[j], j))
        self.p[:] = 0.0
        self.latency[:] = np.inf
        need = 1.0 - self.epsilon
        for j in order:
            self.p[j] = self.p_on_time(j, i, t, slo, insts)
            if self.p[j] >= need:
                return j
        return self._most_likely()


def _workload(pool_ref: str, rate: float, n: int, seed: int = 0):
    pool = load_pool(pool_ref)
    wl = generate_workload(WorkloadConfig(requests=n, arrivals=ArrivalSpec("poisson", rate), seed=seed))
    specs = [InstanceSpec.from_config(c) for c in pool.instances]
    inputs = workload_inputs(wl.requests, wl.quality, specs, ReplayConfig(seed=seed))
    return pool, wl, specs, inputs


def _run(pool, wl, router, seed: int = 0):
    twin = Twin.from_pool(pool, TwinConfig(seed=seed, record_steps=False))
    res = twin.run(wl.requests, router, predicted=router.inputs.pred_total)
    return res.requests[["request_id", "instance_id", "ttft_s"]].to_numpy()


def _sfs(specs, inputs, overhead):
    from estimators.estimate import build

    return [build("sfs", s.profile, None, inputs.route.pred_total, overhead, online_lps=True) for s in specs]


# --- groups and policies ---------------------------------------------------

def test_groups_are_a_models_instances_with_equal_utility_columns():
    u = np.array([[1.0, 2.0, 1.0, 2.0, 1.0], [3.0, 2.0, 3.0, 2.0, 3.5]])
    g = ModelGroups(u, ["a", "b", "a", "b", "a"])
    assert [m.tolist() for m in g.members] == [[0, 2], [1, 3], [4]]  # a's replica 4 is priced apart
    assert g.order(0).tolist() == [1, 0, 2] and g.tied(0)  # a and a's apart replica tie in query 0
    assert g.order(1).tolist() == [2, 0, 1] and not g.tied(1)
    assert g.flat_order(0, u[0]) == [1, 3, 0, 2, 4] == sorted(range(5), key=lambda j: (-u[0][j], j))
    # two models tying exactly: the one-level walk interleaves them by index
    t = np.array([[1.0, 1.0, 1.0, 1.0]])
    gt = ModelGroups(t, ["a", "b", "a", "b"])
    assert gt.tied(0) and gt.flat_order(0, t[0]) == [0, 1, 2, 3]


def test_random_tie_walk_is_seeded_and_uniform():
    a, b = TieBreaker("random", 7), TieBreaker("random", 7)
    walks = [tuple(a.walk([3, 4, 5])) for _ in range(3000)]
    assert walks[:50] == [tuple(b.walk([3, 4, 5])) for _ in range(50)]
    firsts = Counter(w[0] for w in walks)
    assert set(firsts) == {3, 4, 5} and min(firsts.values()) > 850
    one = TieBreaker("random", 7)
    assert list(one.walk([9])) == [9] and one._k == 0  # a group of one draws nothing
    with pytest.raises(ValueError, match="tie policy"):
        TieBreaker("first", 0)
    with pytest.raises(ValueError, match="ties"):
        ReplayConfig(ties="first")


class Fixed:
    def __init__(self, lat):
        self.lat = lat

    def estimate(self, view, q):
        return self.lat


def test_hard_rule_policies_on_fixed_estimates():
    # model a on 0, 2, 4 (utility 2); model b on 1, 3 (utility 1); SLO 0.5
    u = np.array([[2.0, 1.0, 2.0, 1.0, 2.0]])
    inp = RouteInputs(np.array([100]), np.array([0.5]), u, np.array([10]))
    lat = [0.4, 0.1, 0.3, 0.2, 0.45]
    models = ["a", "b", "a", "b", "a"]
    views = [object()] * 5

    def pick(ties, lat=lat, seed=0):
        r = LatencyAware(inp, [Fixed(x) for x in lat], "hard", models=models, ties=ties, seed=seed)
        return r.choose(0, 0.0, views)

    assert pick("lowest-index") == 0
    assert pick("least-latency") == 2
    assert {pick("random", seed=s) for s in range(40)} == {0, 2, 4}
    # a's replicas all late: b's by the policy; all late: the fastest of all
    late = [0.9, 0.3, 0.8, 0.2, 0.7]
    assert (pick("lowest-index", late), pick("least-latency", late)) == (1, 3)
    assert all(pick(p, [0.9, 0.6, 0.8, 0.55, 0.7]) == 3 for p in TIE_POLICIES)


def test_shortest_queue_reads_the_fleet_residents_array():
    class FleetViews(list):  # a stand-in for harness.twin.views.fleet.FleetViews
        residents = np.array([4, 2, 7, 2], dtype=np.int64)

    class V:
        def __init__(self, r):
            self.residents = r

    sq = ShortestQueue(RouteInputs(np.array([1]), np.array([1.0]), np.zeros((1, 4)), np.array([1])))
    views = FleetViews(V(r) for r in (9, 9, 0, 9))  # the views disagree: the array is what is read
    assert sq.choose(0, 0.0, views) == 1
    assert sq.choose(0, 0.0, [V(r) for r in (4, 2, 7, 2)]) == 1  # no array: the views, first minimum


# --- byte identity ---------------------------------------------------------

@pytest.mark.parametrize("pool_ref,rate", [("qwen3-h100-x8", 48.0), ("qwen3-h100-x8", 72.0), ("qwen3-h100", 9.0)])
def test_lowest_index_is_the_one_level_walk_on_replicas(pool_ref, rate):
    """On qwen3-h100-x8 (and the paper's pool) the two-level routers with
    ``ties="lowest-index"`` (pruning on) route every request as main's
    one-level loop did (its code above), with the same TTFTs."""
    pool, wl, specs, inputs = _workload(pool_ref, rate, 900)
    models = [s.model for s in specs]
    oh = pool.frontend_overhead_s
    for ref, new in (
        (OneLevelHard(inputs.route, _sfs(specs, inputs, oh), "hard"),
         LatencyAware(inputs.route, _sfs(specs, inputs, oh), "hard", models=models, ties="lowest-index")),
        (OneLevelCC(inputs.route, _sfs(specs, inputs, oh), "cc"),
         ChanceRouter(inputs.route, _sfs(specs, inputs, oh), "cc", models=models, ties="lowest-index")),
    ):
        a, b = _run(pool, wl, ref), _run(pool, wl, new)
        assert np.array_equal(a[:, 1], b[:, 1]) and np.array_equal(a[:, 2].astype(float), b[:, 2].astype(float),
                                                                    equal_nan=True)


def _bytes(res) -> tuple[bytes, dict]:
    m = {k: v for k, v in res.metrics.items() if k not in ("wall_s", "warmup_s", "speedup", "mean_decision_us",
                                                            "ties")}
    return res.requests.to_json().encode(), m


@pytest.mark.parametrize("router,delta", [("sfs-hard", 0.0), ("sfs-cc", 0.0), ("sfs-eu", 0.0),
                                          ("sfs-soft", 1e-6)])
def test_one_instance_per_model_every_policy_is_todays(router, delta):
    pool, wl, _, _ = _workload("qwen3-h100", 8.0, 1500)
    out = [_bytes(replay(pool, "qwen3-h100", wl.requests, wl.quality,
                         ReplayConfig(router=router, delta_per_us=delta, ties=t))) for t in TIE_POLICIES]
    assert out[0] == out[1] == out[2]


# --- pruning ---------------------------------------------------------------

@pytest.mark.parametrize("ties", TIE_POLICIES)
def test_pruned_and_unpruned_decisions_are_identical(ties):
    for seed, rate in ((0, 72.0), (1, 96.0)):
        pool, wl, specs, inputs = _workload("qwen3-h100-x8", rate, 700, seed)
        runs, calls = [], []
        for prune in (True, False):
            r = make_router("sfs-hard", inputs.route, specs, pool.frontend_overhead_s, seed=seed, ties=ties)
            r.prune = prune
            n = [0]

            def counted(*a, f=r.estimate_one, n=n):
                n[0] += 1
                return f(*a)

            r.estimate_one = counted
            runs.append(_run(pool, wl, r, seed))
            calls.append(n[0])
        assert calls[0] < calls[1]  # pruning skipped estimates (at these loads it does)
        assert np.array_equal(runs[0][:, 1], runs[1][:, 1])
        assert np.array_equal(runs[0][:, 2].astype(float), runs[1][:, 2].astype(float), equal_nan=True)


class BoundCheck(LatencyAware):
    """At every decision: every instance's bound against its estimate."""

    checked = finite = above_slo = 0

    def choose(self, i, t, insts) -> int:
        slo = float(self.inputs.slo[i])
        for j in range(len(insts)):
            b = self.bound_one(j, i, t, insts)
            e = self.estimators[j].estimate(insts[j], Query(i, t, int(self.inputs.prompt[i])))
            assert b <= e, (i, j, b, e)
            BoundCheck.checked += 1
            BoundCheck.finite += np.isfinite(b)
            BoundCheck.above_slo += b > slo
        return super().choose(i, t, insts)


@pytest.mark.parametrize("rate,ties", [(48.0, "lowest-index"), (96.0, "lowest-index"), (72.0, "random")])
def test_the_bound_never_exceeds_the_estimate(rate, ties):
    pool, wl, specs, inputs = _workload("qwen3-h100-x8", rate, 600, 3)
    BoundCheck.checked = BoundCheck.finite = BoundCheck.above_slo = 0
    r = BoundCheck(inputs.route, _sfs(specs, inputs, pool.frontend_overhead_s), "hard",
                   models=[s.model for s in specs], ties=ties)
    _run(pool, wl, r, 3)
    assert BoundCheck.checked == 600 * 24 and BoundCheck.finite == BoundCheck.checked  # a bound everywhere here
    if rate >= 96.0:
        assert BoundCheck.above_slo > 0  # overloaded replicas are pruned: the bound is not vacuous


# --- plumbing --------------------------------------------------------------

def test_replay_and_sweep_record_the_tie_policy(tmp_path):
    r = run_cli("replay", "--pool", "qwen3-h100-x8", "--rate", "24", "--requests", "200", "--router", "sfs-cc",
                "--ties", "random", "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["ties"] == "random"
    r = run_cli("replay", "--rate", "8", "--requests", "50", "--ties", "first", "--out", tmp_path / "x")
    assert r.exit_code == 2 and "--ties" in r.output
    r = run_cli("sweep", "--pool", "qwen3-h100-x8", "--rates", "24", "--requests", "100", "--routers",
                "sfs-hard", "--ties", "least-latency", "--workers", "1", "--out", tmp_path / "s")
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "s" / "metrics.json").read_text())["ties"] == "least-latency"


# --- shared utility columns (memory at fleet size) -------------------------

def test_replicas_share_utility_columns_and_replay_as_full_tables(monkeypatch):
    """x8's 24 instances hold 3 utility columns (one per model), and a
    replay reading them gives the bytes of the full N x J tables."""
    import routers.utility as ut

    pool, wl, specs, inputs = _workload("qwen3-h100-x8", 48.0, 600)
    u = inputs.utility.predicted
    assert isinstance(u, ut.ByInstance) and u.table.shape == (600, 3) and u.shape == (600, 24)
    full = np.asarray(u)
    assert full.shape == (600, 24) and np.array_equal(full[5], u[5]) and u[7, 13] == full[7, 13]
    rows, cols = np.arange(600), np.arange(600) % 24
    assert np.array_equal(inputs.utility.realised[rows, cols], np.asarray(inputs.utility.realised)[rows, cols])
    shared = [_bytes(replay(pool, "qwen3-h100-x8", wl.requests, wl.quality, ReplayConfig(router=r, ties=t)))
              for r, t in (("sfs-cc", "least-latency"), ("latency-agnostic", "lowest-index"))]
    monkeypatch.setattr(ut, "distinct_columns", lambda m, a, b: (list(range(len(m))), np.arange(len(m))))
    plain = workload_inputs(wl.requests, wl.quality, specs, ReplayConfig(seed=0)).utility.predicted
    assert isinstance(plain, np.ndarray) and np.array_equal(plain, full)
    apart = [_bytes(replay(pool, "qwen3-h100-x8", wl.requests, wl.quality, ReplayConfig(router=r, ties=t)))
             for r, t in (("sfs-cc", "least-latency"), ("latency-agnostic", "lowest-index"))]
    assert shared == apart
