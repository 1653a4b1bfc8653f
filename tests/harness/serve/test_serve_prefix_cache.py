"""Prefix caching in ``latroute serve``: block hash ids from the
prompts' own token ids, hits as vLLM grants them (the shared full blocks,
capped so one token is computed), vLLM's prefix-cache counters, and a
recording the offline twin replays with the same hits and the same steps.

The engine is checked on a hand-driven clock against the offline twin; the
server as a real subprocess on 127.0.0.1, over HTTP, bounded in time."""
from __future__ import annotations

import signal
import time

import numpy as np
import pandas as pd
import pytest

from harness.serve.engine import ServedEngine
from harness.serve.prefix import block_hashes
from harness.twin.instance import InstanceSpec, TwinConfig
from harness.twin.pools.spec import load_pool
from harness.twin.simulation import Twin, fixed_router

B = 16  # the block size of qwen3-h100-pc's instances


def _toks(seed: int, n: int) -> list[int]:
    return [int(x) for x in np.random.default_rng(seed).integers(3, 8192, n)]


def test_block_hashes_are_chained_over_full_blocks():
    a = _toks(1, 100)
    b = a[:64] + _toks(2, 36)
    ha, hb = block_hashes(a, B), block_hashes(b, B)
    assert len(ha) == len(hb) == 6  # 100 // 16 full blocks; the partial tail has no id
    assert ha[:4] == hb[:4] and all(x != y for x, y in zip(ha[4:], hb[4:]))
    c = a[:16] + [a[16] + 1] + a[17:]  # one token changed in block 1: blocks 1.. differ (the chain)
    hc = block_hashes(c, B)
    assert hc[0] == ha[0] and all(x != y for x, y in zip(ha[1:], hc[1:]))
    assert block_hashes(a, B) == ha and all(0 <= x < 1 << 62 for x in ha)  # the same ids every time
    salted = block_hashes(a, B, salt="tenant-1")
    assert not set(salted) & set(ha) and salted != block_hashes(a, B, salt="tenant-2")


class HandClock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def wall(self, t: float) -> float:
        return time.monotonic()


PROMPTS = {  # name: (tokens, expected hit on instance 0 in the order below)
    "a": (_toks(1, 100), 0),
    "b": (_toks(1, 64) + _toks(2, 36), 64),  # shares a's first 4 full blocks
    "c": (_toks(1, 100), 96),  # all of a's 6 full blocks
    "d": (_toks(1, 96), 80),  # 6 full blocks cached, capped at (96 - 1) // 16 = 5
    "e": (_toks(3, 90), 0),  # nothing shared
}


def _served(names, gap: float) -> tuple[ServedEngine, pd.DataFrame]:
    spec = InstanceSpec.from_config(load_pool("qwen3-h100-pc").instances[0])
    clock = HandClock()
    e = ServedEngine(0, spec, TwinConfig(seed=0, noise=False, record_steps=True), clock, hash_block=B)
    rows = []
    for i, name in enumerate(names):
        clock.t = i * gap
        e.catch_up(clock.t)
        tokens = PROMPTS[name][0]
        h = e.submit(name, len(tokens), 8, block_hashes(tokens, B))
        rows.append({"request_id": i, "arrival_s": clock.t, "prompt_tokens": len(tokens), "output_tokens": 8,
                     "hash_ids": h.hash_ids})
    e.catch_up(np.inf)
    return e, pd.DataFrame(rows)


def test_shared_prefixes_hit_as_vllm_and_replay_offline():
    names = list(PROMPTS)
    e, req = _served(names, gap=1.0)  # each request done before the next: hits are what the cache holds
    assert [h.cached for h in e.requests] == [PROMPTS[n][1] for n in names]
    spec = e.spec
    off = Twin([spec], TwinConfig(seed=0, noise=False, record_steps=True)).run(
        req, fixed_router(np.zeros(len(req), dtype=np.int64)), hash_block_tokens=B)
    assert off.requests["cached_tokens"].tolist() == [h.cached for h in e.requests]
    e.inst.flush_log()
    served = e.inst.step_log(np.arange(len(req)))
    pd.testing.assert_frame_equal(served.steps, off.log.steps)
    pd.testing.assert_frame_equal(served.step_items, off.log.step_items)


def test_without_hash_ids_nothing_is_shared():
    spec = InstanceSpec.from_config(load_pool("qwen3-h100-pc").instances[0])
    clock = HandClock()
    e = ServedEngine(0, spec, TwinConfig(noise=False), clock, hash_block=B)
    for i in range(2):
        clock.t = float(i)
        e.catch_up(clock.t)
        e.submit(f"x{i}", 100, 4, None)
    e.catch_up(np.inf)
    assert [h.cached for h in e.requests] == [0, 0]


def test_many_requests_grow_the_hash_arrays():
    """More requests and ids than the first arrays hold, arriving faster
    than they are served (most are first scheduled by the step that ends
    as the next is planned, the inter-step gap being 0): the state is
    handed the re-made arrays, every request gets its hit and its start,
    and the offline twin agrees."""
    spec = InstanceSpec.from_config(load_pool("qwen3-h100-pc").instances[0])
    clock = HandClock()
    e = ServedEngine(0, spec, TwinConfig(seed=0, noise=False, record_steps=False), clock, hash_block=B)
    rng = np.random.default_rng(5)
    system = _toks(9, 320)
    rows = []
    for i in range(300):
        clock.t = i * 0.004
        e.catch_up(clock.t)
        tokens = system + _toks(100 + i, int(rng.integers(900, 1100)))
        h = e.submit(f"r{i}", len(tokens), 4, block_hashes(tokens, B))
        rows.append({"request_id": i, "arrival_s": clock.t, "prompt_tokens": len(tokens), "output_tokens": 4,
                     "hash_ids": h.hash_ids})
    e.catch_up(np.inf)
    assert e.hashes.used > 1 << 14 and e.hashes.off.size > 256
    got = [h.cached for h in e.requests]
    assert got[0] == 0 and min(got[1:]) == 320  # the system prompt's 20 blocks, every time
    assert all(np.isfinite(h.scheduled_t) and h.scheduled_t >= h.arrival_t for h in e.requests)
    assert sum(h.scheduled_t > h.arrival_t for h in e.requests) > 100  # most queued behind a step
    off = Twin([spec], TwinConfig(seed=0, noise=False, record_steps=False)).run(
        pd.DataFrame(rows), fixed_router(np.zeros(len(rows), dtype=np.int64)), hash_block_tokens=B)
    assert off.requests["cached_tokens"].tolist() == got


@pytest.mark.parametrize("pool", ["qwen3-h100", "qwen3-h100-pc"])
def test_counters_with_and_without_caching(pool):
    """Queued requests (first scheduled as a step ends) all reach the
    queue-time histogram; the prefix-cache counters move only where the
    instance caches, by prompt and cached tokens (vLLM skips the lookup
    without caching)."""
    from harness.serve.metrics import EngineMetrics

    spec = InstanceSpec.from_config(load_pool(pool).instances[0])
    clock = HandClock()
    m = EngineMetrics(spec.model, spec.config.max_model_len)
    e = ServedEngine(0, spec, TwinConfig(noise=False, record_steps=False), clock, m, hash_block=B)
    system = _toks(9, 64)
    for i in range(40):
        clock.t = i * 0.002
        e.catch_up(clock.t)
        tokens = system + _toks(200 + i, 500)
        e.submit(f"m{i}", len(tokens), 6, block_hashes(tokens, B))
    e.catch_up(np.inf)
    assert sum(h.scheduled_t > h.arrival_t for h in e.requests) > 10
    lab = {"model_name": spec.model, "engine": "0"}

    def value(name: str) -> float:
        return m.registry.get_sample_value(name, lab)

    assert value("vllm:request_queue_time_seconds_count") == 40 and value("vllm:request_queue_time_seconds_sum") > 0
    caching = spec.config.caching
    assert value("vllm:prefix_cache_queries_total") == (40 * 564 if caching else 0)
    assert value("vllm:prefix_cache_hits_total") == (39 * 64 if caching else 0)


# ------------------------------------------------------------------ the server, over HTTP
pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
from tests.harness.serve import test_serve_http as th  # noqa: E402  (its server helpers)


def _text(tokens: list[int]) -> str:
    return " ".join(f"w{t}" for t in tokens)


def _pc(port: int) -> tuple[float, float]:
    m = th.metrics(port)
    q = next(v for (n, _), v in m.items() if n == "vllm:prefix_cache_queries_total")
    h = next(v for (n, _), v in m.items() if n == "vllm:prefix_cache_hits_total")
    return q, h


def test_served_prefix_cache_over_http_replays_offline(tmp_path, monkeypatch):
    from harness.serve.faithful import offline_on_served
    from harness.twin.fidelity.decisions import decision_agreement
    from traces.store import open_trace

    monkeypatch.setattr(th, "POOL", "qwen3-h100-pc")
    p, base = th.start_serve(tmp_path, "--record", str(tmp_path / "rec"))
    try:
        a = _toks(1, 100)
        sends = [  # (instance, kind, tokens, expected cached)
            (0, "text", a, 0),
            (0, "ids", a[:64] + _toks(2, 36), 64),
            (0, "text", a, 96),
            (1, "ids", a, 0),  # another instance: its own cache
            (0, "ids", _toks(3, 90), 0),
            (1, "chat", a[:47], 0),  # chat: <s> + content = 48 tokens; <s> first, so nothing of a
            (1, "chat", a[:47] + [5, 6], 48),  # the templated prompt (<s> first) shares the last one's 3 blocks
        ]
        want_q = {0: 0, 1: 0}
        want_h = {0: 0, 1: 0}
        for k, (inst, kind, tokens, cached) in enumerate(sends):
            if kind == "chat":
                body = {"messages": [{"role": "user", "content": _text(tokens)}], "max_tokens": 4}
                path, prompt = "/v1/chat/completions", len(tokens) + 1
            else:
                body = {"prompt": _text(tokens) if kind == "text" else tokens, "max_tokens": 4}
                path, prompt = "/v1/completions", len(tokens)
            status, out, _ = th.post(base + inst, path, body, {"X-Request-Id": f"q{k}"})
            assert status == 200, out
            assert out["usage"]["prompt_tokens"] == prompt
            assert out["usage"]["prompt_tokens_details"]["cached_tokens"] == cached, (k, out["usage"])
            want_q[inst] += prompt
            want_h[inst] += cached
            assert _pc(base + inst) == (want_q[inst], want_h[inst])
        assert _pc(base + 2) == (0, 0)  # nothing sent there
        status, out, _ = th.post(base, "/v1/completions", {"prompt": a, "max_tokens": 2, "cache_salt": ""})
        assert status == 400 and out["error"]["param"] == "cache_salt"
        status, out, _ = th.post(base, "/v1/completions", {"prompt": a, "max_tokens": 2, "cache_salt": "t1"})
        assert status == 200 and out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # a salt shares nothing
    finally:
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    rec = open_trace(tmp_path / "rec")
    assert rec.meta["hash_block_tokens"] == B
    served = rec.read("requests")
    assert served["cached_tokens"].tolist() == [s[3] for s in sends] + [0]
    both = offline_on_served(rec, load_pool("qwen3-h100-pc"))
    np.testing.assert_array_equal(both["served_cached"].to_numpy(), both["offline_cached"].to_numpy())
    np.testing.assert_array_equal(both["served"].to_numpy(), both["offline"].to_numpy())
    for inst in rec.read("instances")["instance_id"]:
        r = decision_agreement(rec, str(inst))
        assert r.agree == r.steps, inst
