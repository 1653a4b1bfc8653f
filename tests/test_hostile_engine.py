"""Engine slice: the compiled entries refuse what would make them
index past an array's end or loop on a non-finite time (``KernelInputError``
at the entry), ``calibrate`` refuses degenerate or contradictory step logs in
one line naming the trace's file, and profile and pool files are validated
where they are read (file, key, reason).
"""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from estimators.engine.config import InstanceConfig
from estimators.engine.layout import F_STATUS, PL_N, S_NFREE_SLOTS, ST_RUNNING, KernelInputError
from estimators.engine.state import SchedState, StepPlan
from tests.adversarial import refused_cleanly

# ------------------------------------------------------------ the recorded-batch entry


def _state(caching: bool = False, blocks: int = 64, max_len: int = 256) -> SchedState:
    cfg = InstanceConfig(max_num_batched_tokens=512, max_num_seqs=8, block_size=16, num_kv_blocks=blocks,
                         max_model_len=max_len, prefix_caching=caching)
    st = SchedState.new(cfg, capacity=6)
    for rid in range(3):
        st.add(rid, 40, 4)
    return st


def _plan(slots, tokens=None, computed=None, preempted=()) -> tuple[StepPlan, int, int]:
    plan = StepPlan.new(8)
    n = len(slots)
    plan.slot[:n] = slots
    plan.tokens[:n] = tokens if tokens is not None else [40] * n
    plan.computed[:n] = computed if computed is not None else [0] * n
    plan.preempted[: len(preempted)] = preempted
    plan.counts[PL_N] = n
    return plan, n, len(preempted)


def _apply(st, plan, n, n_pre):
    from estimators.engine.recorded import apply_batch

    apply_batch(st, plan, n, n_pre)


def _snapshot(st: SchedState) -> list[np.ndarray]:
    return [a.copy() for a in (st.req, st.sc, st.running, st.waiting, st.free_slots)]


def test_a_valid_recorded_batch_still_applies():
    st = _state()
    plan, n, n_pre = _plan([0, 1])
    _apply(st, plan, n, n_pre)
    assert list(st.running_slots()) == [0, 1] and st.req[0, F_STATUS] == ST_RUNNING


@pytest.mark.parametrize("slots,preempted,fragment", [
    ([-1], (), "before it arrived"),                 # a request that never arrived maps to slot -1
    ([6], (), "before it arrived"),                  # past the state's rows
    ([2**40], (), "before it arrived"),
    ([0, 0], (), "same request twice"),
    ([1], (0,), "not running"),                      # preempting a waiting request
    ([], (7,), "not running"),
])
def test_apply_batch_refuses_what_the_state_cannot_take(slots, preempted, fragment):
    st = _state()
    before = _snapshot(st)
    plan, n, n_pre = _plan(slots, preempted=preempted)
    with pytest.raises(KernelInputError, match=fragment):
        _apply(st, plan, n, n_pre)
    assert all(np.array_equal(a, b) for a, b in zip(before, _snapshot(st)))  # refused before anything moved


def test_apply_batch_refuses_a_finished_request_scheduled_again():
    """requests.csv output lengths shorter than the steps show: the request
    finished in the walk and its slot was recycled; scheduling it again
    would recycle the slot twice (free_slots written past its end)."""
    from estimators.engine.kernel import complete_step

    st = _state()
    plan, n, _ = _plan([0], tokens=[40])
    _apply(st, plan, n, 0)
    st.req[0, 1] = 1  # target 1 output: finishes at this step's output
    complete_step(st, plan, n)
    assert st.sc[S_NFREE_SLOTS] == 4
    plan, n, _ = _plan([0], tokens=[1], computed=[40])
    with pytest.raises(KernelInputError, match="not waiting or running"):
        _apply(st, plan, n, 0)
    assert st.sc[S_NFREE_SLOTS] == 4


def test_apply_batch_refuses_a_pending_request():
    from estimators.engine.layout import ST_PENDING

    st = _state()
    s = st.add(9, 40, 4, status=ST_PENDING)  # arrived, not yet handed to the scheduler
    plan, n, _ = _plan([s])
    with pytest.raises(KernelInputError, match="not waiting or running"):
        _apply(st, plan, n, 0)


def test_apply_batch_with_prefix_caching_refuses_blocks_the_pool_or_table_lacks():
    st = _state(caching=True, blocks=4)  # 3 usable blocks of 16 tokens
    plan, n, _ = _plan([0], tokens=[40])  # 3 blocks: fits
    _apply(st, plan, n, 0)
    plan, n, _ = _plan([1], tokens=[40])  # 3 more: the pool has none (num_kv_blocks contradicts the steps)
    with pytest.raises(KernelInputError, match="num_kv_blocks"):
        _apply(st, plan, n, 0)
    st = _state(caching=True, blocks=1000, max_len=48)  # a table of 4 blocks
    plan, n, _ = _plan([0], tokens=[40 * 4])
    with pytest.raises(KernelInputError, match="max_model_len"):
        _apply(st, plan, n, 0)


@pytest.mark.parametrize("bad", [-1, 1 << 62, (1 << 63) - 1])
def test_hash_ids_outside_the_pool_range_are_refused_with_their_row(bad):
    from estimators.trace_blocks import request_hashes

    ok = request_hashes([[1, 2], [3, 4]], np.array([32, 32]), 16, 16)
    assert ok.flat.tolist() == [1, 2, 3, 4]
    with pytest.raises(KernelInputError, match="row 2: hash_ids"):
        request_hashes([[1, 2], [3, bad]], np.array([32, 32]), 16, 16)


# ------------------------------------------------------------ non-finite times at the entries


def _sfs_and_view(infl_start: float | None):
    from estimators.sfs.estimator import SFS
    from estimators.snapshot import Snapshot
    from estimators.timemodel.profile import load_profile

    st = _state()
    plan, n, _ = _plan([0], tokens=[40])
    _apply(st, plan, n, 0)
    sfs = SFS(load_profile("qwen3-8b-h100"), np.full(16, 8, dtype=np.int64))
    view = Snapshot(1.0, "i0", st, np.zeros(st.capacity, np.int64), 0, plan, n if infl_start is not None else 0,
                    infl_start)
    return sfs, view


@pytest.mark.parametrize("t,start", [(float("nan"), None), (float("inf"), None), (1.0, float("nan")),
                                     (1.0, float("-inf"))])
def test_sfs_refuses_a_non_finite_time(t, start):
    from estimators.engine.view import Query

    sfs, view = _sfs_and_view(None if start is None else 0.5)
    assert np.isfinite(sfs.estimate(view, Query(t=1.0, rid=5, prompt=40)))  # the same view with finite times
    view.infl_start = start
    with pytest.raises(KernelInputError):
        sfs.estimate(view, Query(t=t, rid=5, prompt=40))


def test_sfs_refuses_a_resident_without_a_predicted_length():
    from estimators.engine.view import Query

    sfs, view = _sfs_and_view(None)
    view.state.req[1, 6] = 10**6  # F_RID past pred_total
    with pytest.raises(KernelInputError, match="predicted length"):
        sfs.estimate(view, Query(t=1.0, rid=5, prompt=40))


def test_time_model_refuses_a_non_finite_profile():
    from estimators.timemodel.kernel_form import time_model
    from estimators.timemodel.profile import load_profile

    p = load_profile("qwen3-8b-h100")
    time_model(p)
    bad = replace(p, coefficients=np.where(np.arange(p.coefficients.size) == 1, np.nan, p.coefficients))
    with pytest.raises(KernelInputError, match="finite"):
        time_model(bad)
    with pytest.raises(KernelInputError, match="finite"):
        time_model(replace(p, step_gap_s=float("inf")))


# ------------------------------------------------------------ calibrate on corrupted full traces


@pytest.fixture(scope="module")
def twin_run():
    from harness.twin.pools.spec import load_pool
    from harness.twin.simulation import Twin, TwinConfig, shortest_queue_router
    from traces.workload.arrivals import ArrivalSpec
    from traces.workload.generator import WorkloadConfig, generate_workload

    pool = load_pool("qwen3-h100")
    pool = replace(pool, instances=pool.instances[1:2])
    wl = generate_workload(WorkloadConfig(requests=60, arrivals=ArrivalSpec("poisson", 4.0), seed=1))
    return Twin.from_pool(pool, TwinConfig(seed=1)).run(wl.requests, shortest_queue_router)


def _trace(path: Path, r, **tables) -> Path:
    """A trace written with TraceWriter (the store's own checks, not the importer's)."""
    from traces.store import TraceWriter

    tabs = {"requests": r.requests, "steps": r.steps, "step_items": r.step_items, "instances": r.instances,
            **tables}
    with TraceWriter(path) as w:
        for name, df in tabs.items():
            w.write_table(name, df)
    return path


def _durations(steps: pd.DataFrame, d: np.ndarray) -> pd.DataFrame:
    start = np.cumsum(np.r_[0.0, d[:-1] + 1e-4]) + float(steps["start_s"].iloc[0])
    return steps.assign(start_s=start, end_s=start + d)


def _calibrate_refused(tmp_path, trace, *fragments):
    (tmp_path / "out").mkdir()
    return refused_cleanly(["calibrate", trace, "--out", tmp_path / "out" / "p.json"], [trace, tmp_path / "out"],
                           *fragments)


def test_calibrate_on_identical_step_times_of_a_full_trace_says_so(tmp_path, twin_run):
    """main: the walk along made-up times scheduled requests before they
    arrived, and the slot bookkeeping wrote past free_slots (heap corruption)."""
    steps = _durations(twin_run.steps, np.full(len(twin_run.steps), 0.01))
    trace = _trace(tmp_path / "t", twin_run, steps=steps)
    # the store's cross-table check (traces.checks.consistency) now refuses it before calibration reads a step
    _calibrate_refused(tmp_path, trace, str(trace / "requests.parquet"), "arrival_s",
                       str(trace / "step_items.parquet"))


def test_calibrate_on_half_zero_durations_names_the_row(tmp_path, twin_run):
    d = (twin_run.steps["end_s"] - twin_run.steps["start_s"]).to_numpy()
    trace = _trace(tmp_path / "t", twin_run, steps=_durations(twin_run.steps, np.where(np.arange(d.size) % 2, d, 0.0)))
    _calibrate_refused(tmp_path, trace, str(trace / "requests.parquet"), "arrival_s",
                       str(trace / "step_items.parquet"))


def test_calibrate_on_outputs_the_steps_contradict_names_step_items(tmp_path, twin_run):
    """requests.output_tokens shorter than the steps show: main crashed with
    ``IndexError: index N is out of bounds`` after compiled code recycled slots twice."""
    reqs = twin_run.requests.assign(output_tokens=1)
    trace = _trace(tmp_path / "t", twin_run, requests=reqs)
    _calibrate_refused(tmp_path, trace, str(trace / "requests.parquet"), "output_tokens",
                       str(trace / "step_items.parquet"))


def test_calibrate_on_a_max_model_len_the_prompts_exceed(tmp_path, twin_run):
    trace = _trace(tmp_path / "t", twin_run, instances=twin_run.instances.assign(max_model_len=64))
    _calibrate_refused(tmp_path, trace, str(trace / "instances.parquet"), "max_model_len",
                       str(trace / "step_items.parquet"))


# ------------------------------------------------------------ profile and pool files at entry


def _profile_doc() -> dict:
    from estimators.timemodel.builtin_profiles import BUILTIN_PROFILES
    from estimators.timemodel.profile import BatchTimeProfile

    return json.loads(json.dumps(BatchTimeProfile.from_json(BUILTIN_PROFILES["qwen3-8b-h100"]).to_json(),
                                 default=float))


def _pool_doc() -> dict:
    from harness.twin.pools.spec import load_pool

    return json.loads(json.dumps(load_pool("qwen3-h100").to_json()))


def _set(doc: dict, path: str, value):
    d = doc
    *head, last = path.split("/")
    for k in head:
        d = d[int(k)] if isinstance(d, list) else d[k]
    d[last] = value
    return doc


BIG = "1" + "0" * 400
PROFILE_CASES = [
    ("form", [], "form", None),
    ("coefficients/const/value", BIG, "coefficients.const", "digits"),
    ("coefficients/P/value", 1e300, "coefficients.P", "outside"),
    ("noise/stall_excess_quantiles", {"x": 1.0}, "noise.stall_excess_quantiles.x", None),
    ("noise/stall_excess_quantiles", {"0.5": -1.0}, "noise.stall_excess_quantiles", None),
    ("noise/log_mu", 1000.0, "noise", None),
    ("noise/stall_excess_mean", -1.0, "noise", None),
    ("noise/log_sigma", BIG, "noise", None),
    ("intake/boundaries", 1e300, "intake", None),
    ("name", ["x"], "name", None),
    ("derived", "x", "derived", None),
    ("derived", {"lps": {"k": "many"}}, "derived.lps.k", None),
    ("derived", {"theta_pre_tokens_per_s": BIG}, "derived.theta_pre_tokens_per_s", "digits"),
    ("derived", {"queue": {"b0": 1e300, "b1": 0.0}}, "derived.queue.b0", "outside"),
    ("metrics", {"speed_baseline": {"all": {"median_ratio": 0.0, "n": 3}}}, "metrics.speed_baseline.all", None),
    ("metrics", {"speed_baseline": {"all": {"median_ratio": 1.0, "mean_log_ratio": 1e10}}},
     "metrics.speed_baseline.all.mean_log_ratio", None),
]


def _write_doc(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc).replace(f'"{BIG}"', BIG))  # the 400-digit integer as a JSON number
    return path


@pytest.mark.parametrize("key,value,column,fragment", PROFILE_CASES)
def test_profile_files_are_validated_at_entry(tmp_path, key, value, column, fragment):
    from estimators.timemodel.profile import load_profile
    from traces.errors import BadInput

    path = _write_doc(tmp_path / "p.json", _set(_profile_doc(), key, value))
    with pytest.raises(BadInput) as e:
        load_profile(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: {column}"), msg
    if fragment:
        assert fragment in msg, msg


POOL_CASES = [
    ("instances/0/price_in", BIG, "instances.price_in"),
    ("instances/0/price_out", 1e300, "instances.price_out"),
    ("instances/0/host_speed", BIG, "instances.host_speed"),
    ("instances/0/host_speed", 1e9, "instances.host_speed"),
    ("instances/0/chunked_prefill", "yes", "instances.chunked_prefill"),
    ("instances/0/chunked_prefill", False, "instances"),   # vLLM refuses it with a budget under max_model_len
    ("instances/0/prefix_caching", "false", "instances.prefix_caching"),
    ("instances/0/device", 3, "instances.device"),
]


@pytest.mark.parametrize("key,value,column", POOL_CASES)
def test_pool_files_are_validated_at_entry(tmp_path, key, value, column):
    from harness.twin.pools.spec import load_pool
    from traces.errors import BadInput

    path = _write_doc(tmp_path / "pool.json", _set(_pool_doc(), key, value))
    with pytest.raises(BadInput) as e:
        load_pool(path)
    assert str(e.value).startswith(f"{path}:1: {column}"), str(e.value)


def test_a_valid_pool_and_profile_file_still_load(tmp_path):
    from estimators.timemodel.profile import load_profile
    from harness.twin.pools.spec import load_pool

    assert load_pool(_write_doc(tmp_path / "pool.json", _pool_doc())) == load_pool("qwen3-h100")
    p = load_profile(_write_doc(tmp_path / "p.json", _profile_doc()))
    assert np.array_equal(p.coefficients, load_profile("qwen3-8b-h100").coefficients)


@pytest.mark.parametrize("which", ["profile", "pool"])
def test_a_fifo_given_as_profile_or_pool_is_refused_without_waiting(tmp_path, which):
    fifo = tmp_path / f"{which}.json"
    os.mkfifo(fifo)
    out = tmp_path / "out"
    out.mkdir()
    args = (["replay", "--pool", fifo, "--rate", 8, "--requests", 10, "--out", out / "r"] if which == "pool"
            else ["estimate", tmp_path / "nowhere", "--profile", fifo, "--out", out / "e"])
    if which == "pool":
        refused_cleanly(args, [out], str(fifo), "named pipe")
    else:
        from estimators.timemodel.profile import load_profile
        from traces.errors import BadInput

        with pytest.raises(BadInput, match="named pipe"):
            load_profile(fifo)


def test_the_twin_kernel_refuses_to_advance_to_a_non_finite_time():
    """main: ``advance(NaN)`` compared every step's end with NaN, ran nothing
    and returned as if the instance were up to date."""
    from harness.twin.instance import Instance, InstanceSpec, new_outcomes
    from harness.twin.pools.spec import load_pool
    from harness.twin.simulation import TwinConfig

    inst = Instance(0, InstanceSpec.from_config(load_pool("qwen3-h100").instances[1]), TwinConfig(seed=1))
    out = new_outcomes(4)
    inst.add(0, 100, 4)
    inst.kick(0.0)
    inst.advance(0.5, out)  # a finite time runs the steps due
    assert np.isfinite(out.first_t[0])
    inst.add(1, 100, 4)
    inst.kick(0.6)
    with pytest.raises(KernelInputError, match="not a number"):
        inst.advance(float("nan"), out)


@pytest.mark.parametrize("prompt", [64, 10**6, -1])
def test_a_prompt_the_front_end_refuses_never_reaches_the_scheduler(prompt):
    """main: admitted with prefix caching on, its blocks were written past
    its block table (max_model_len 64: a table of 5 blocks). (V0 refuses
    such prompts in its own scheduler: test_sched_kernel.)"""
    st = _state(caching=True, blocks=1000, max_len=64)
    st.add(7, 63, 4)  # the longest prompt the front end lets through
    with pytest.raises(KernelInputError, match="max_model_len"):
        st.add(8, prompt, 4)
