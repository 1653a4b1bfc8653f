"""The truth is not in the view.

A router plug-in and an estimator plug-in that walk everything they are
given (``tests.plugin_router.walk_numbers``: every attribute, container,
array and array base, closure) must find no resident's true output length
and no in-flight step's true end, under the ``median`` length policy; a
router declared ``oracle`` is handed the live instances and does find
them (the walk is not blind), as does an estimator told ``oracle`` lengths.

The true lengths are made unmistakable: every request's is a distinct
number above 10^6, far beyond the toy instances' max_model_len (each
request ends at that limit), so no counter, prompt, id or block number
can equal one. A step's end is a float drawn with the twin's noise: the
in-flight step's end appears nowhere unless the view carries it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.plugin_router as pr
from estimators.engine.config import InstanceConfig
from estimators.estimate import EstimateConfig, estimate_trace
from estimators.timemodel.fit import NoiseModel
from estimators.timemodel.profile import BatchTimeProfile
from harness.twin.replay import ReplayConfig, workload_inputs
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig, write_twin_trace
from routers.registry import make_router
from traces.store import TraceWriter, open_trace

SENTINEL = 1_000_003
PROFILE = BatchTimeProfile("toy", "eq9", np.array([2e-3, 2e-6, 0.0, 0.0]), NoiseModel(log_sigma=0.2))


def specs(n: int) -> list[InstanceSpec]:
    return [InstanceSpec(InstanceConfig(instance_id=f"i{k}", model=("qwen3-0.6b", "qwen3-8b", "qwen3-32b")[k],
                                        max_num_batched_tokens=256, max_num_seqs=6,
                                        num_kv_blocks=200, max_model_len=320), PROFILE) for k in range(n)]


def workload(n: int, rate: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": np.arange(n) + 500, "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                         "prompt_tokens": rng.integers(16, 200, n),
                         "output_tokens": SENTINEL + 2 * rng.permutation(n)})


def truths(reqs: pd.DataFrame, told: np.ndarray) -> np.ndarray:
    """The true lengths a plug-in must not find (less any it was told: the
    median policy may name one request's length as everyone's prediction)."""
    out = reqs["output_tokens"].to_numpy()
    return np.setdiff1d(out, told)


def inflight_ends(steps: pd.DataFrame, t: float) -> np.ndarray:
    s = steps[(steps["start_s"] <= t) & (steps["end_s"] > t)]
    return s["end_s"].to_numpy(dtype=np.float64)


def route(router_path: str, reqs: pd.DataFrame, n_inst: int, seed: int):
    """A replay as ``harness.twin.replay.replay`` runs one: the registry's
    router, the twin handed the predicted lengths; the step log kept."""
    sp = specs(n_inst)
    inputs = workload_inputs(reqs, None, sp, ReplayConfig(lengths="median", slo="rule", quality="model")).route
    router = make_router(router_path, inputs, sp, 0.0, true_outputs=reqs["output_tokens"].to_numpy())
    pr.SEEN.clear()
    res = Twin(sp, TwinConfig(seed=seed)).run(reqs, router, predicted=inputs.pred_total)
    return res, inputs.pred_total, list(pr.SEEN)


def leaks(seen, steps, secret) -> tuple[int, int]:
    """(calls that reached a true length, calls that reached an in-flight step's end)."""
    lengths = sum(bool(np.isin(secret, ints).any()) for _, ints, _ in seen)
    ends = sum(bool(np.isin(inflight_ends(steps, t), floats).any()) for t, _, floats in seen)
    return lengths, ends


def check_router_walk(n: int, rate: float, instances: int, seed: int) -> None:
    reqs = workload(n, rate, seed)
    res, told, seen = route("tests.plugin_router:Walker", reqs, instances, seed)
    assert len(seen) == n
    assert res.requests["finish_reason"].eq("length").all()  # the sentinels were never reached
    busy = sum(len(inflight_ends(res.steps, t)) > 0 for t, _, _ in seen)
    assert busy > 0  # decisions were taken while steps were in flight
    assert leaks(seen, res.steps, truths(reqs, told)) == (0, 0)


CASES = dict(n=st.integers(12, 30), rate=st.floats(20.0, 80.0), instances=st.integers(1, 3), seed=st.integers(0, 2**16))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(**CASES)
def test_a_router_plugin_that_reads_everything_finds_no_truth(n, rate, instances, seed):
    check_router_walk(n, rate, instances, seed)


@pytest.mark.fuzz
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(**CASES)
def test_a_router_plugin_that_reads_everything_finds_no_truth_campaign(n, rate, instances, seed):
    check_router_walk(n, rate, instances, seed)


def test_an_oracle_router_plugin_is_handed_the_truth(monkeypatch):
    import harness.twin.instance as hi

    for name, size in (("LOG_STEPS", 1 << 10), ("LOG_ITEMS", 1 << 12), ("LOG_PRE", 1 << 8)):
        monkeypatch.setattr(hi, name, size)  # small step-log buffers (flushed more often): less for it to walk
    reqs = workload(12, 40.0, 3)
    res, told, seen = route("tests.plugin_router:OracleWalker", reqs, 2, 3)
    lengths, ends = leaks(seen, res.steps, truths(reqs, told))
    assert lengths >= len(seen) - 1 and ends > 0  # every call but the first (nothing resident yet)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> str:
    """A twin trace with sentinel lengths, steps and measured TTFTs."""
    reqs = workload(24, 40.0, 7)
    res = Twin(specs(2), TwinConfig(seed=7)).run(reqs, lambda i, t, insts: i % 2)
    path = tmp_path_factory.mktemp("served") / "t"
    with TraceWriter(path) as w:
        write_twin_trace(w, res)
    return str(path)


def estimate_seen(served: str, lengths: str):
    trace = open_trace(served)
    pr.SEEN.clear()
    estimate_trace(trace, {"i0": (PROFILE, None), "i1": (PROFILE, None)},
                   EstimateConfig(estimators=("tests.plugin_router:SnapshotWalker",), lengths=lengths))
    return trace, list(pr.SEEN)


def test_an_estimator_plugin_that_reads_its_snapshots_finds_no_truth(served):
    trace, seen = estimate_seen(served, "median")
    reqs, steps = trace.read("requests"), trace.read("steps")
    assert len(seen) >= len(reqs)  # each request scored
    from traces.policies.lengths import predicted_lengths
    secret = truths(reqs, predicted_lengths(reqs, "median").tokens)
    assert leaks(seen, steps, secret) == (0, 0)
    told, seen_oracle = estimate_seen(served, "oracle")  # not blind: told the lengths, it finds them
    assert leaks(seen_oracle, steps, reqs["output_tokens"].to_numpy())[0] > 0
