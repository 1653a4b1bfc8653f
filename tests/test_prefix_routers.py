"""Prefix-aware routers on stand-in instances (the live-cache lookup is the
kernel's and is tested there)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routers.base import RouteInputs
from routers.prefix_affinity import PrefixAffinity, PrefixLoad


@dataclass
class FakeInst:
    hit: int
    residents: int
    usage: float = 0.0

    def cached_prefix_tokens(self, i, prompt):
        return self.hit

    def kv_usage(self):
        return self.usage


def inputs(prompt=1000):
    return RouteInputs(np.array([prompt]), np.array([1.0]), np.zeros((1, 3)), np.array([100]))


def test_longest_prefix_then_fewest_residents():
    r = PrefixAffinity(inputs())
    assert r(0, 0.0, [FakeInst(128, 1), FakeInst(512, 9), FakeInst(256, 0)]) == 1
    assert r(0, 0.0, [FakeInst(0, 5), FakeInst(0, 2), FakeInst(0, 3)]) == 1


def test_weighted_score_trades_prefix_against_load():
    r = PrefixLoad(inputs(1000))
    # a full hit beats a moderate load gap ...
    assert r(0, 0.0, [FakeInst(1000, 6), FakeInst(0, 4), FakeInst(0, 5)]) == 0
    # ... but a small hit on the busiest, fullest instance loses to an idle one
    assert r(0, 0.0, [FakeInst(200, 20, 0.9), FakeInst(0, 0, 0.0)]) == 1


def test_prefix_affinity_keeps_sessions_on_the_instance_that_holds_them():
    """On a live twin, prefix-affinity sends a session's later turns where its
    earlier turns left their blocks, so it hits more than shortest-queue."""
    from dataclasses import replace

    from harness.twin.pools.spec import load_pool
    from harness.twin.simulation import Twin, TwinConfig
    from routers.registry import make_router
    from traces.workload.sessions import SessionConfig, generate_sessions

    pool = load_pool("qwen3-h100")
    pool = replace(pool, instances=tuple(replace(c, prefix_caching=True) for c in pool.instances))
    wl = generate_sessions(SessionConfig(requests=400, rate=4.0, seed=2)).requests
    inputs = RouteInputs(wl["prompt_tokens"].to_numpy(), wl["slo_ttft_s"].to_numpy(), np.zeros((len(wl), 3)),
                         wl["predicted_output_tokens"].to_numpy())
    hit = {}
    for name in ("prefix-affinity", "shortest-queue"):
        res = Twin.from_pool(pool, TwinConfig(noise=False, record_steps=False)).run(
            wl, make_router(name, inputs, [], 0.0), hash_block_tokens=16)
        hit[name] = res.requests["cached_tokens"].sum() / res.requests["prompt_tokens"].sum()
    assert hit["prefix-affinity"] > hit["shortest-queue"] + 0.1, hit


def test_sweep_over_a_session_trace_replays_its_shared_prefixes(tmp_path):
    """A sweep of a trace with hash_ids on a pool with prefix caching takes
    the trace's hash_block_tokens (it once dropped it: no hit anywhere, and
    prefix-affinity was shortest-queue to the last digit)."""
    import pandas as pd

    from harness.twin.pools.spec import load_pool
    from tests.conftest import run_cli

    pc, off = load_pool("qwen3-h100-pc"), load_pool("qwen3-h100")  # vLLM's default (caching on), the paper's (off)
    assert all(c.caching for c in pc.instances) and not any(c.caching for c in off.instances)
    assert [(c.instance_id, c.num_kv_blocks) for c in pc.instances] == [(c.instance_id, c.num_kv_blocks)
                                                                        for c in off.instances]
    assert run_cli("trace", "generate", "--sessions", "--requests", 300, "--rate", 4, "--seed", 1,
                   "--out", tmp_path / "chat").exit_code == 0
    res = run_cli("sweep", "--trace", tmp_path / "chat", "--pool", "qwen3-h100-pc", "--rates", 4,
                  "--requests", 300, "--routers", "prefix-affinity,shortest-queue", "--workers", 1,
                  "--out", tmp_path / "sw")
    assert res.exit_code == 0, res.output
    r = pd.read_parquet(tmp_path / "sw" / "results.parquet").set_index("router")
    assert r.loc["prefix-affinity", "prefix_hit_rate"] > r.loc["shortest-queue", "prefix_hit_rate"] + 0.1
    assert r.loc["shortest-queue", "prefix_hit_rate"] > 0
