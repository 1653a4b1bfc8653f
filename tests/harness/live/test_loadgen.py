"""``latroute loadgen`` against a small in-process fake OpenAI server on
127.0.0.1: what it sends (token-id prompts, exact lengths, shared blocks,
X-Request-Id), what it measures, and every fault it must survive."""
from __future__ import annotations

import asyncio
import json
import socket
import threading

import numpy as np
import pandas as pd
import pytest

from tests.conftest import assert_refused, run_cli
from traces.store import TraceWriter, open_trace

aiohttp = pytest.importorskip("aiohttp")
from aiohttp import web  # noqa: E402


class FakeServer:
    """Streams ``max_tokens`` chunks per request like vLLM's completions
    endpoint. ``mode(client_id)`` picks a fault: ok, 500, malformed, cut
    (stream stops without [DONE], connection closed), kill (the whole server
    stops: in-flight streams die, later requests are refused)."""

    def __init__(self, mode=lambda rid: "ok", gap_s: float = 0.002) -> None:
        self.mode, self.gap_s = mode, gap_s
        self.seen: dict[str, dict] = {}
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.runner = None
        self.port = 0
        self.dead = False  # set by a kill: from then on every stream dies at once, before cleanup() has run

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._completions)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self.ready.set()
        self.loop.run_forever()

    async def _models(self, request):
        return web.json_response({"data": [{"id": "fake-model"}]})

    async def _completions(self, request):
        rid = request.headers.get("X-Request-Id", "")
        body = await request.json()
        self.seen[rid] = body
        mode = self.mode(rid)
        if self.dead:
            request.transport.close()
            return web.Response(status=503)
        if mode == "500":
            return web.Response(status=500, text="internal error")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(body["max_tokens"]):
            await asyncio.sleep(self.gap_s)
            if self.dead:
                request.transport.close()
                return resp
            if mode == "malformed" and i == 1:
                await resp.write(b"data: {not json\n\n")
                continue
            if mode in ("cut", "kill") and i == 2:
                if mode == "kill":
                    self.dead = True
                    asyncio.get_running_loop().create_task(self.runner.cleanup())
                request.transport.close()
                return resp
            await resp.write(b'data: {"choices": [{"index": 0, "text": "w5"}]}\n\n')
        usage = {"choices": [], "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": body["max_tokens"]}}
        await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    def __enter__(self) -> FakeServer:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        async def stop():
            await self.runner.cleanup()
        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _trace(path, n=6, hashed=True):
    reqs = pd.DataFrame({"request_id": np.arange(n, dtype=np.int64), "arrival_s": np.arange(n) * 0.01,
                         "prompt_tokens": np.array([300, 200, 140, 50, 260, 129][:n], dtype=np.int64),
                         "output_tokens": np.array([5, 4, 6, 3, 5, 4][:n], dtype=np.int64)})
    if hashed:
        reqs["hash_ids"] = [[1, 2], [1], [1], [], [1, 2], [3]][:n]
    with TraceWriter(path) as w:
        w.meta["source"] = {"kind": "test"}
        w.meta["hash_block_tokens"] = 128
        w.write_table("requests", reqs)
    return reqs


def test_loadgen_sends_exact_prompts_and_measures(tmp_path):
    reqs = _trace(tmp_path / "t")
    with FakeServer() as srv:
        res = run_cli("loadgen", "--base-url", srv.url, "--trace", tmp_path / "t", "--out", tmp_path / "c")
    assert res.exit_code == 0, res.output
    assert sorted(srv.seen) == [f"r{i}" for i in range(6)]
    prompts = {rid: body["prompt"] for rid, body in srv.seen.items()}
    for i, row in reqs.iterrows():
        p = prompts[f"r{i}"]
        assert len(p) == row.prompt_tokens and all(isinstance(t, int) and t >= 3 for t in p)
        assert srv.seen[f"r{i}"]["max_tokens"] == row.output_tokens and srv.seen[f"r{i}"]["ignore_eos"] is True
    # equal hash ids -> identical blocks; different ids or unhashed tails -> different tokens
    assert prompts["r0"][:256] == prompts["r4"][:256] and prompts["r0"][:128] == prompts["r1"][:128]
    assert prompts["r1"][128:] != prompts["r2"][128:140]
    assert prompts["r5"][:128] != prompts["r0"][:128]
    t = open_trace(tmp_path / "c").read("requests")
    assert len(t) == 6 and (t["status"] == "ok").all() and t["error"].isna().all()
    assert (t["ttft_s"] > 0).all() and (t["e2e_s"] >= t["ttft_s"]).all()
    assert (t["output_tokens"].to_numpy() == reqs["output_tokens"].to_numpy()).all()
    assert (t["itl_mean_s"] > 0).all() and list(t["client_id"]) == [f"r{i}" for i in t["request_id"]]
    bench = json.loads((tmp_path / "c" / "bench.json").read_text())
    assert bench["completed"] == 6 and bench["failed"] == 0 and len(bench["itls"][0]) == 4
    assert bench["mean_ttft_ms"] > 0 and bench["model_id"] == "fake-model"
    # and `vllm bench serve`'s importer reads it
    res = run_cli("trace", "import", "vllm-bench", tmp_path / "c" / "bench.json", "--out", tmp_path / "b")
    assert res.exit_code == 0, res.output
    assert len(open_trace(tmp_path / "b").read("requests")) == 6


def test_http_errors_and_malformed_streams_are_kept_and_counted(tmp_path):
    _trace(tmp_path / "t")
    modes = {"r1": "500", "r3": "malformed", "r4": "cut"}
    with FakeServer(lambda rid: modes.get(rid, "ok")) as srv:
        res = run_cli("loadgen", "--base-url", srv.url, "--trace", tmp_path / "t", "--out", tmp_path / "c")
    assert res.exit_code == 1
    assert "3 of 6 requests failed" in res.stderr
    t = open_trace(tmp_path / "c").read("requests").set_index("request_id")
    assert list(t["status"].sort_index()) == ["ok", "error", "ok", "error", "error", "ok"]
    assert t.loc[1, "error"].startswith("HTTP 500")
    assert "malformed stream" in t.loc[3, "error"]
    assert "without [DONE]" in t.loc[4, "error"] or "connection lost" in t.loc[4, "error"]
    assert np.isnan(t.loc[1, "ttft_s"]) and t.loc[0, "ttft_s"] > 0


def test_server_killed_mid_run(tmp_path):
    _trace(tmp_path / "t", hashed=False)
    # the server dies while streaming r2; r0 and r1 finished before (arrivals 10 ms apart, 2 ms per token)
    with FakeServer(lambda rid: "kill" if rid == "r2" else "ok", gap_s=0.001) as srv:
        res = run_cli("loadgen", "--base-url", srv.url, "--trace", tmp_path / "t", "--out", tmp_path / "c",
                      "--request-timeout", "5")
    assert res.exit_code == 1
    t = open_trace(tmp_path / "c").read("requests").set_index("request_id").sort_index()
    assert len(t) == 6
    assert list(t["status"][:2]) == ["ok", "ok"] and (t["status"][2:] == "error").all()
    assert "requests failed" in res.stderr and f"{(t['status'] == 'error').sum()} of 6" in res.stderr


def test_unreachable_server_and_bad_input(tmp_path):
    _trace(tmp_path / "t")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_cli("loadgen", "--base-url", f"http://127.0.0.1:{port}", "--trace", tmp_path / "t",
                  "--out", tmp_path / "c")
    assert res.exit_code == 1 and "not reachable" in res.stderr and not (tmp_path / "c").exists()
    assert_refused(run_cli("loadgen", "--base-url", "ftp://127.0.0.1:1", "--trace", tmp_path / "t",
                           "--out", tmp_path / "c"), tmp_path / "c", "--base-url")
    assert_refused(run_cli("loadgen", "--base-url", "http://127.0.0.1:1", "--out", tmp_path / "c"),
                   tmp_path / "c", "--num-prompts")
    assert_refused(run_cli("loadgen", "--base-url", "http://127.0.0.1:1", "--trace", tmp_path / "t",
                           "--request-rate", "2", "--out", tmp_path / "c"), tmp_path / "c", "--request-rate")


def test_generated_arrivals_follow_vllm_bench(tmp_path):
    with FakeServer() as srv:
        res = run_cli("loadgen", "--base-url", srv.url, "--num-prompts", "5", "--request-rate", "50",
                      "--input-len", "20", "--output-len", "3", "--max-concurrency", "2", "--prompt-format", "words",
                      "--out", tmp_path / "c")
    assert res.exit_code == 0, res.output
    words = srv.seen["r0"]["prompt"].split()
    assert len(words) == 20 and all(w.startswith("w") and int(w[1:]) >= 3 for w in words)
    t = open_trace(tmp_path / "c").read("requests")
    assert (t["prompt_tokens"] == 20).all() and (t["output_tokens"] == 3).all()
    bench = json.loads((tmp_path / "c" / "bench.json").read_text())
    assert bench["request_rate"] == 50 and bench["max_concurrency"] == 2 and bench["completed"] == 5
