"""Exact event skipping in the twin's kernel (``harness.twin.loop.skip``):
with skipping on, every array of an instance (scheduler state, in-flight
plan, times, noise stream, speed factor, step log, outcomes) is bit for
bit what step-by-step scheduling leaves, after every ``advance`` call, and
a whole replay serves and logs the same; the counts of skipped steps show
the fast path ran."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from estimators.engine.config import InstanceConfig
from estimators.engine.layout import S_WN
from harness.twin import instance as ti
from harness.twin.instance import Instance, InstanceSpec, TwinConfig, new_outcomes
from harness.twin.loop import parts as lp
from harness.twin.pools.spec import load_pool
from harness.twin.simulation import Twin, shortest_queue_router
from traces.workload.generator import WorkloadConfig, generate_workload


def _arrays(inst: Instance) -> list[np.ndarray]:
    """Everything the kernel reads or writes, but the skip switch and its counter."""
    st, tw, lg, m = inst.state, inst.tw, inst.log, inst.meta
    k, n, p = m[lp.M_LOG_STEPS], m[lp.M_LOG_ITEMS], m[lp.M_LOG_PRE]  # the log's filled part
    return [st.cfg, st.req, st.sc, st.running, st.waiting, st.free_slots, *inst.plan, tw.inbox,
            m[: lp.M_SKIPPED], tw.times, tw.params[: lp.P_SKIP_ON], tw.rng, tw.speed,
            lg.t[:k], lg.n[:k], lg.npre[:k], lg.items[:n], lg.pre[:p]]


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.int64) if a.dtype == np.float64 else a


def _same(a: Instance, b: Instance, oa, ob) -> None:
    for x, y in zip(_arrays(a), _arrays(b), strict=True):
        assert np.array_equal(_bits(x), _bits(y))
    for x, y in zip(oa, ob, strict=True):
        assert np.array_equal(_bits(x), _bits(y))
    assert len(a.log_parts) == len(b.log_parts)
    for pa, pb in zip(a.log_parts, b.log_parts, strict=True):
        for x, y in zip(pa, pb, strict=True):
            assert np.array_equal(_bits(x), _bits(y))


def _lockstep(engine: dict, noise: bool, record: bool, n: int = 160, rate: float = 3.0, pmax: int = 3000,
              omax: int = 500, seed: int = 0) -> tuple[Instance, lp.Outcomes, int]:
    """Drive two instances (skipping off, on) through the same arrivals,
    advancing both to the arrivals and to random times between them (the
    twin's router refreshes), comparing every array after every call; also
    returns how many calls skipped steps while a request waited."""
    spec = InstanceSpec.from_config(InstanceConfig(instance_id="x", model="qwen3-8b", profile="qwen3-8b-h100",
                                                   **engine))
    a, b = (Instance(0, spec, TwinConfig(seed=seed, noise=noise, record_steps=record, skip=s)) for s in (False, True))
    oa, ob = new_outcomes(n), new_outcomes(n)
    rng = np.random.default_rng(seed)
    t = 0.0
    waited = 0

    def both(u):
        nonlocal waited
        k = b.meta[lp.M_SKIPPED]
        a.advance(u, oa)
        b.advance(u, ob)
        _same(a, b, oa, ob)
        waited += bool(b.meta[lp.M_SKIPPED] > k and b.state.sc[S_WN] > 0)

    for i in range(n):
        gap = rng.exponential(1 / rate)
        for u in np.sort(rng.uniform(t, t + gap, rng.integers(0, 3))):
            both(u)
        t += gap
        both(t)
        p, o = int(rng.integers(1, pmax)), int(rng.integers(1, omax))
        for x in (a, b):
            x.add(i, p, o)
            if x.idle:
                x.kick(t)
    a.advance(np.inf, oa)
    b.advance(np.inf, ob)
    a.flush_log()
    b.flush_log()
    _same(a, b, oa, ob)
    assert np.isfinite(ob.finish_t).sum() + np.isfinite(ob.reject_t).sum() == n  # everything served or refused
    return b, ob, waited


OFF = {"prefix_caching": False}  # the paper's setting; caching on has block ids: never skipped


@pytest.mark.parametrize(("engine", "what"), [
    ({**OFF, "max_num_batched_tokens": 32768, "max_num_seqs": 512, "num_kv_blocks": 370_000 // 16}, "paper"),
    ({**OFF, "num_kv_blocks": 700}, "preempts"),
    ({**OFF, "max_num_batched_tokens": 384}, "chunks"),
    ({**OFF, "long_prefill_token_threshold": 200, "max_num_batched_tokens": 1024, "num_kv_blocks": 900}, "chunks"),
    ({**OFF, "max_model_len": 1200, "num_kv_blocks": 400}, "length"),
    ({**OFF, "max_num_seqs": 6}, "waits"),
    ({"policy": "sarathi", "num_kv_blocks": 800, "max_num_batched_tokens": 512}, "preempts"),
    ({"policy": "vllm-v0", "chunked_prefill": False, "num_kv_blocks": 800, "max_model_len": 4096,
      "max_num_batched_tokens": 4096}, "preempts"),
])
@pytest.mark.parametrize("noise", [False, True])
def test_skipping_leaves_every_array_as_step_by_step_does(engine, what, noise):
    pmax = 1000 if what == "length" else 3000
    inst, out, waited = _lockstep(engine, noise, record=True, pmax=pmax)
    steps, skipped = int(inst.meta[lp.M_STEPS]), int(inst.meta[lp.M_SKIPPED])
    assert 0 < skipped < steps  # the fast path ran, and the kernel around it
    log = inst.step_log(np.arange(len(out.first_t)))
    if what in ("preempts", "waits"):
        assert waited > 0  # runs skipped past a waiting head the scheduler kept refusing (KV, max_num_seqs)
    if what == "preempts":
        assert out.preempt_n.sum() > 0
    elif what == "chunks":
        items = log.step_items
        assert (items["tokens"] < items["prompt_tokens"]).any() and (items["tokens"] > 1).any()
    elif what == "length":
        assert out.length_capped.sum() > 0


def test_a_full_step_log_mid_run_is_flushed_and_logged_the_same(monkeypatch):
    monkeypatch.setattr(ti, "LOG_STEPS", 37)
    monkeypatch.setattr(ti, "LOG_ITEMS", 900)
    inst, _, _ = _lockstep({**OFF, "num_kv_blocks": 2000}, noise=True, record=True, n=80)
    assert len(inst.log_parts) > 5 and inst.meta[lp.M_SKIPPED] > 0


def test_without_step_recording_and_with_prefix_caching():
    inst, _, _ = _lockstep({**OFF}, noise=True, record=False, n=80)
    assert inst.meta[lp.M_SKIPPED] > 0
    inst, _, _ = _lockstep({"prefix_caching": True, "num_kv_blocks": 900}, noise=True, record=True, n=80)
    assert inst.meta[lp.M_SKIPPED] == 0  # block ids and a free queue: step by step


def _replay(pool, w, skip: bool, noise: bool):
    seen = {}

    def probe(i, t, insts):
        seen["insts"] = insts

    res = Twin.from_pool(pool, TwinConfig(noise=noise, skip=skip)).run(w, shortest_queue_router, on_arrival=probe)
    return res, sum(int(x.meta[lp.M_SKIPPED]) for x in seen["insts"])


def _pool_file(tmp_path, **engine):
    base = load_pool("qwen3-h100")
    rows = [{**{k: v for k, v in vars(c).items() if v is not None}, **engine} for c in base.instances]
    p = tmp_path / "pool.json"
    p.write_text(json.dumps({"name": "small-kv", "frontend_overhead_s": 0.005, "instances": rows}))
    return load_pool(p)


@pytest.mark.parametrize(("pool_name", "noise"), [("qwen3-h100", False), ("qwen3-h100", True), ("qwen3-h100-x8", False),
                                               ("small-kv", True), ("chunked", False)])
def test_replays_serve_and_log_the_same_with_skipping_on_and_off(tmp_path, pool_name, noise):
    if pool_name == "small-kv":
        pool = _pool_file(tmp_path, num_kv_blocks=600)
    elif pool_name == "chunked":
        pool = _pool_file(tmp_path, max_num_batched_tokens=512, long_prefill_token_threshold=256)
    else:
        pool = load_pool(pool_name)
    w = generate_workload(WorkloadConfig(requests=120 if pool_name == "qwen3-h100-x8" else 300, seed=5)).requests
    w["arrival_s"] = w["arrival_s"] / (8 if pool_name == "qwen3-h100-x8" else 2)
    a, _ = _replay(pool, w, False, noise)
    b, skipped = _replay(pool, w, True, noise)
    assert skipped > 0 and a.steps_run == b.steps_run
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    for name in ("steps", "step_items", "preemptions"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    if pool_name == "small-kv":
        assert b.requests["preemptions"].sum() > 0


def test_the_oracles_forks_skip_too_and_it_routes_the_same():
    """The oracle advances forks of the live instances (their switch
    copied): every decision, so every result, is the same on and off."""
    from routers.base import RouteInputs
    from routers.oracle import Oracle

    w = generate_workload(WorkloadConfig(requests=150, seed=3)).requests
    w["arrival_s"] = w["arrival_s"] / 6
    pool = load_pool("qwen3-h100")
    out = w["output_tokens"].to_numpy()
    utility = np.tile([0.3, 0.6, 0.9], (len(w), 1))  # the largest model while it meets the SLO
    inputs = RouteInputs(w["prompt_tokens"].to_numpy(), np.full(len(w), 0.3), utility, out)
    res = [Twin.from_pool(pool, TwinConfig(seed=5, skip=skip)).run(w, Oracle(inputs, out, pool.frontend_overhead_s))
           for skip in (False, True)]
    pd.testing.assert_frame_equal(res[0].requests, res[1].requests, check_exact=True)
    pd.testing.assert_frame_equal(res[0].step_items, res[1].step_items, check_exact=True)
    assert res[0].requests["instance_id"].nunique() >= 2
