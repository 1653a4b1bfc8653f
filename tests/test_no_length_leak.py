"""No router sees true output lengths.

Property: at every arrival, a router's decision does not change when the
true output lengths -- the query's and every resident's -- are changed while
everything the router may see stays the same. Checked for every registered
router that does not declare itself an oracle, under every length policy
but ``oracle``, on traces with and without a predicted-length column.

Two copies of each router are built: A from the workload, B from the same
workload with other true output lengths. A twin replay (driven by
shortest-queue) calls both at every arrival, A on the live instances and B
on copies whose residents' true lengths (``F_TARGET``) are the B lengths
(never below what a resident has already produced plus one, so nothing a
router may see differs). The B lengths keep the trace's median output
length, which the ``median`` policy may know (a statistic of past
traffic, not a per-request truth).
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estimators.engine.layout import F_OUTPUTS, F_RID, F_TARGET
from harness.twin.pool_baselines import pool_baselines
from harness.twin.pools.spec import load_pool
from harness.twin.replay import ReplayConfig, workload_inputs
from harness.twin.simulation import Twin, TwinConfig, shortest_queue_router
from routers.registry import REGISTRY, make_router
from traces.policies.lengths import trace_median_output
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload

POOL = "qwen3-h100"
ROUTERS = [name for name, e in REGISTRY.items() if not e.oracle]
POLICIES = [(True, None), (True, "column"), (True, "median"), (True, "constant:300"),
            (False, None), (False, "median"), (False, "constant:300")]


def other_lengths(output: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """New true lengths with the same median: values below the lower middle
    order statistic stay at or below it, values above the upper one stay
    at or above it, the middle ones are kept."""
    s = np.sort(output)
    lo, hi = s[(len(s) - 1) // 2], s[len(s) // 2]
    new = output.copy()
    below, above = output < lo, output > hi
    new[below] = rng.integers(1, lo + 1, below.sum())
    new[above] = rng.integers(hi, 4097, above.sum())
    return new


def resident_slots(inst) -> np.ndarray:
    st_ = inst.state
    return np.concatenate([st_.running_slots(), st_.waiting_slots(), inst.inbox_slots()])


@pytest.fixture(scope="module")
def setup():
    wl = generate_workload(WorkloadConfig(requests=160, arrivals=ArrivalSpec("poisson", 14.0), seed=5))
    return wl, load_pool(POOL), pool_baselines(POOL)


def mismatches(setup, has_column: bool, lengths: str | None, seed: int) -> list[tuple[str, int]]:
    """(router, arrival) where router A and router B decided differently."""
    wl, pool, baselines = setup
    req_a = wl.requests if has_column else wl.requests.drop(columns=["predicted_output_tokens"])
    out_b = other_lengths(req_a["output_tokens"].to_numpy(), np.random.default_rng(seed))
    req_b = req_a.assign(output_tokens=out_b)
    assert trace_median_output(req_b) == trace_median_output(req_a)
    assert (out_b != req_a["output_tokens"].to_numpy()).mean() > 0.8

    twin = Twin.from_pool(pool, TwinConfig(seed=1, record_steps=False))
    pairs = []
    for frame in (req_a, req_b):
        inputs = workload_inputs(frame, wl.quality, twin.specs, ReplayConfig(lengths=lengths, seed=3)).route
        pairs.append([make_router(name, inputs, twin.specs, pool.frontend_overhead_s,
                                  1e-6 if REGISTRY[name].uses_delta else 0.0, seed=3,
                                  baselines=baselines if REGISTRY[name].needs_baselines else None)
                      for name in ROUTERS])
    routers_a, routers_b = pairs
    changed_residents, bad = 0, []

    def drive(i, t, insts):
        nonlocal changed_residents
        views_b = copy.deepcopy(insts)
        for inst in views_b:
            slots = resident_slots(inst)
            r = inst.state.req
            r[slots, F_TARGET] = np.maximum(out_b[r[slots, F_RID]], r[slots, F_OUTPUTS] + 1)
            changed_residents += int((r[slots, F_TARGET] != insts[inst.index].state.req[slots, F_TARGET]).sum())
        for name, ra, rb in zip(ROUTERS, routers_a, routers_b):
            if ra(i, t, insts) != rb(i, t, views_b):
                bad.append((name, i))
        return shortest_queue_router(i, t, insts)

    twin.run(req_a, drive)
    assert changed_residents > 100  # the residents' true lengths really differed at many arrivals
    return bad


@pytest.mark.parametrize("has_column,lengths", POLICIES)
@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31))
def test_decisions_do_not_depend_on_true_lengths(setup, has_column, lengths, seed):
    assert mismatches(setup, has_column, lengths, seed) == []


def test_the_property_catches_the_old_replay_leak(setup, monkeypatch):
    """Not vacuous: replay's old fallback (true output_tokens when a trace
    has no predicted_output_tokens) breaks the property."""
    import harness.twin.replay
    from traces.policies.lengths import PredictedLengths, predicted_lengths

    def old_fallback(requests, policy=None):
        if "predicted_output_tokens" in requests:
            return predicted_lengths(requests, policy)
        return PredictedLengths(np.maximum(requests["output_tokens"].to_numpy(dtype=np.int64), 1), "median", "")

    monkeypatch.setattr(harness.twin.replay, "predicted_lengths", old_fallback)
    bad = mismatches(setup, False, None, 0)
    assert {name for name, _ in bad} >= {"least-tokens", "sfs-hard"}, bad
