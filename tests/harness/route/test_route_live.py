"""``latroute route`` as a real proxy: ``latroute serve`` backends and the
proxy as subprocesses on 127.0.0.1, driven over HTTP by aiohttp-free
clients and by ``latroute loadgen``; backends that refuse connections,
answer 5xx, or are killed mid-stream. Every wait is bounded."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness.live.ports import free_port_base as free_base
from tests.harness.serve.test_serve_http import events, get, open_stream, post

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
SPEED = 4.0


def _start(cmd: list[str], cwd: Path, ready: str = "ready", timeout: float = 90.0) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", *cmd], cwd=cwd, env=ENV, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    for line in p.stdout:
        if line.startswith(ready):
            return p
        if time.monotonic() > deadline:
            break
    p.kill()
    raise RuntimeError(f"{cmd[0]} did not start: {p.stderr.read()}")


def _stop(p: subprocess.Popen, sig=signal.SIGTERM) -> tuple[str, str]:
    if p.poll() is None:
        p.send_signal(sig)
    try:
        return p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()
        raise


def _one_instance_pool(path: Path, iid: str, model: str) -> Path:
    path.write_text(json.dumps({"name": iid, "frontend_overhead_s": 0.005, "instances": [
        {"instance_id": iid, "model": model, "profile": f"{model}-h100", "num_kv_blocks": 20000,
         "max_num_batched_tokens": 8192, "max_num_seqs": 256, "max_model_len": 40960}]}))
    return path


def _serve_one(tmp: Path, iid: str, model: str) -> tuple[subprocess.Popen, int]:
    port = free_base(1)
    pool = _one_instance_pool(tmp / f"{iid}.json", iid, model)
    return _start(["serve", "--pool", str(pool), "--port-base", str(port), "--noise", "off", "--speed",
                   str(SPEED)], tmp), port


class _Fails(BaseHTTPRequestHandler):
    """A backend that answers every request 500 (and /health too)."""

    def _fail(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"error": {"message": "boom", "code": 500}}'
        self.send_response(500)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET = _fail

    def log_message(self, *a):
        pass


@pytest.fixture(scope="module")
def backends(tmp_path_factory):
    """Two one-instance serve processes (a: qwen3-0.6b, b: qwen3-8b) started side by side."""
    tmp = tmp_path_factory.mktemp("route")
    started = {}
    threads = [threading.Thread(target=lambda k=k, m=m: started.__setitem__(k, _serve_one(tmp, k, m)))
               for k, m in (("a", "qwen3-0.6b"), ("b", "qwen3-8b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    yield tmp, started
    for p, _ in started.values():
        if p.poll() is None:
            p.kill()
            p.wait()


def _route_pool(tmp: Path, name: str, entries: list[tuple[str, str, str]]) -> Path:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"name": name, "frontend_overhead_s": 0.005, "instances": [
        {"instance_id": iid, "model": model, "profile": f"{model}-h100", "num_kv_blocks": 20000,
         "max_num_batched_tokens": 8192, "max_num_seqs": 256, "max_model_len": 40960, "url": url}
        for iid, model, url in entries]}))
    return path


def _route(tmp: Path, pool: Path, router: str, log: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    port = free_base(1)
    p = _start(["route", "--pool", str(pool), "--router", router, "--listen", f"127.0.0.1:{port}", "--speed",
                str(SPEED), "--log", str(log), *extra], tmp)
    return p, port


def by_id(req, client_id: str):
    return req.set_index("client_id").loc[client_id]


def _read_log(path: Path):
    from traces.store import open_trace

    t = open_trace(path)
    return t.read("requests"), t.read("decisions"), json.loads((path / "meta.json").read_text())


def test_route_proxies_streams_and_logs_every_decision(backends):
    tmp, s = backends
    pool = _route_pool(tmp, "ab", [("a", "qwen3-0.6b", f"http://127.0.0.1:{s['a'][1]}"),
                                   ("b", "qwen3-8b", f"http://127.0.0.1:{s['b'][1]}")])
    log = tmp / "log-ok"
    p, port = _route(tmp, pool, "sfs-cc", log)
    try:
        assert get(port, "/health")[0] == 200
        assert [m["id"] for m in json.loads(get(port, "/v1/models")[1])["data"]] == ["qwen3-0.6b", "qwen3-8b"]
        st, body, headers = post(port, "/v1/completions", {"prompt": "w5 w6 w7", "max_tokens": 4,
                                                           "model": "anything"},
                                 {"X-Request-Id": "whole-1", "x-llm-d-slo-ttft-ms": "300"})
        assert st == 200 and body["model"] in ("qwen3-0.6b", "qwen3-8b") and {k.lower(): v for k, v in headers.items()}["x-request-id"] == "whole-1"
        assert body["usage"]["completion_tokens"] == 4 and body["id"] == "cmpl-whole-1"
        c, resp = open_stream(port, {"prompt": [5] * 50, "max_tokens": 6, "latroute": {"slo_ttft_ms": 250,
                                                                                        "predicted_tokens": 3}},
                              "stream-1")
        ev = events(resp)
        c.close()
        assert ev[-1] == "[DONE]" and len(ev) == 7  # one chunk per token, as the backend sent them
        assert "".join(e["choices"][0]["text"] for e in ev[:-1]).count(" w") == 6
        st, chat, _ = post(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "w9"}],
                                                          "max_tokens": 2}, {"X-Request-Id": "chat-1"})
        assert st == 200 and chat["object"] == "chat.completion"
        st, bad, _ = post(port, "/v1/completions", {"prompt": "w1", "max_tokens": 0}, {"X-Request-Id": "bad-1"})
        assert st == 400 and bad["error"]["param"] == "max_tokens"  # refused as vLLM refuses it, never routed
        st, bad, _ = post(port, "/v1/completions", {"prompt": "w1"}, {"x-llm-d-slo-ttft-ms": "soon"})
        assert st == 400 and bad["error"]["param"] == "x-llm-d-slo-ttft-ms"
        lg = subprocess.run([sys.executable, "-m", "harness.cli", "loadgen", "--base-url", f"http://127.0.0.1:{port}",
                             "--num-prompts", "40", "--request-rate", "40", "--input-len", "120", "--output-len",
                             "12", "--out", str(tmp / "client-ok"), "--time-limit", "60"], env=ENV,
                            capture_output=True, text=True, timeout=90)
        assert lg.returncode == 0, lg.stderr
    finally:
        out, err = _stop(p)
    assert p.returncode == 0, err
    assert "wrote" in out
    req, dec, meta = _read_log(log)
    assert len(req) == 43 and (req["status"] == "ok").all(), req[req["status"] != "ok"][["client_id", "status", "error", "instance_id"]].to_string()
    by = req.set_index("client_id")
    assert by.loc["whole-1", "slo_ttft_s"] == pytest.approx(0.3)
    assert by.loc["stream-1", "slo_ttft_s"] == pytest.approx(0.25)
    assert by.loc["stream-1", "predicted_output_tokens"] == 3 and by.loc["stream-1", "output_tokens"] == 6
    assert by.loc["whole-1", "predicted_output_tokens"] == 4  # --lengths max-tokens
    assert (req["ttft_s"] > 0).all() and (req["finish_s"] >= req["arrival_s"] + req["ttft_s"] - 1e-9).all()
    assert (by.loc[[f"r{k}" for k in range(40)], "output_tokens"] == 12).all()
    # one row per backend and decision; exactly one chosen, where the request went; an estimate for each
    assert len(dec) == 2 * 43 and dec.groupby("request_id")["chosen"].sum().eq(1).all()
    chosen = dec[dec["chosen"]].set_index("request_id")["instance_id"]
    assert (chosen.reindex(req["request_id"]).to_numpy() == req["instance_id"].to_numpy()).all()
    assert dec["estimate_s"].notna().all() and (dec["estimate_s"] > 0).all()
    assert (dec["view"] == "ledger").all() and meta["route"]["events"] == []
    assert dec["residents"].max() >= 1  # the ledger saw requests in flight while deciding


@pytest.mark.parametrize("view", ["metrics", "exact"])
def test_polled_and_exact_views_see_traffic_the_proxy_did_not_send(backends, view):
    """Three long streams go to backend a directly; the metrics view's
    polls and the exact view's state feed count them (the ledger alone
    would not), so shortest-queue sends the proxy's request to b."""
    tmp, s = backends
    pool = _route_pool(tmp, f"ab-{view}", [("a", "qwen3-0.6b", f"http://127.0.0.1:{s['a'][1]}"),
                                           ("b", "qwen3-8b", f"http://127.0.0.1:{s['b'][1]}")])
    log = tmp / f"log-{view}"
    p, port = _route(tmp, pool, "shortest-queue", log, "--view", view, "--poll-interval", "50")
    direct = []
    try:
        direct = [open_stream(s["a"][1], {"prompt": [9] * 30, "max_tokens": 2000}, f"direct{k}") for k in range(3)]
        for _, resp in direct:
            assert events(resp, limit=1)
        time.sleep(0.3)  # a few polls
        st, body, _ = post(port, "/v1/completions", {"prompt": "w5", "max_tokens": 2}, {"X-Request-Id": "m1"})
        assert st == 200 and body["model"] == "qwen3-8b"
    finally:
        for c, _ in direct:
            c.close()
        _stop(p)
    assert p.returncode == 0
    _, dec, meta = _read_log(log)
    row = dec.set_index("instance_id")
    assert (dec["view"] == view).all() and row.loc["a", "residents"] == 3 and row.loc["b", "residents"] == 0
    assert row.loc["b", "chosen"] and 0 <= row.loc["a", "view_age_s"] < 5 * 0.05  # engine seconds, as --poll-interval
    assert meta["source"]["poll_interval_ms"] == (50 if view == "metrics" else None)


def test_route_faults_refused_5xx_and_killed_mid_stream(backends):
    """Backends that refuse connections and answer 500 are marked dead and
    routed around (with --retry the requests still succeed); a backend
    killed mid-stream cuts its streams with an error event, is dropped from
    the view, and every request is in the log."""
    tmp, s = backends
    fails = ThreadingHTTPServer(("127.0.0.1", 0), _Fails)
    threading.Thread(target=fails.serve_forever, daemon=True).start()
    refused = free_base(1)  # nothing listens there
    pool = _route_pool(tmp, "faults", [
        ("gone", "qwen3-8b", f"http://127.0.0.1:{refused}"), ("a", "qwen3-0.6b", f"http://127.0.0.1:{s['a'][1]}"),
        ("five", "qwen3-8b", f"http://127.0.0.1:{fails.server_address[1]}"),
        ("b", "qwen3-8b", f"http://127.0.0.1:{s['b'][1]}")])
    log = tmp / "log-faults"
    p, port = _route(tmp, pool, "round-robin", log, "--retry")
    try:
        for k in range(4):  # round robin meets every backend: the faulty ones fail, the retries (to the next) succeed
            st, body, _ = post(port, "/v1/completions", {"prompt": "w5 w6", "max_tokens": 2}, {"X-Request-Id": f"f{k}"})
            assert st == 200, body
        conns = [open_stream(port, {"prompt": [7] * 20, "max_tokens": 400}, f"long{k}") for k in range(4)]
        firsts = [events(resp, limit=1) for _, resp in conns]  # every stream has produced a token
        assert all(f and f[0] != "[DONE]" for f in firsts)
        s["b"][0].kill()  # b dies mid-stream
        s["b"][0].wait(10)
        ends = []
        for c, resp in conns:
            ends.append(events(resp))
            c.close()
        on_b = [f[0]["model"] == "qwen3-8b" for f in firsts]
        cut = [any(isinstance(x, dict) and "error" in x for x in e) for e in ends]
        assert cut == on_b and any(on_b) and not all(on_b)  # b's streams, and only b's, end in an error event
        assert all(e[-1] == "[DONE]" for e in ends)
        for k in range(4):  # b is dead: everything goes to a
            st, body, _ = post(port, "/v1/completions", {"prompt": "w5", "max_tokens": 2}, {"X-Request-Id": f"g{k}"})
            assert st == 200 and body["model"] == "qwen3-0.6b"
        open_c, open_resp = open_stream(port, {"prompt": [7] * 20, "max_tokens": 20000}, "open1")
        assert events(open_resp, limit=1)  # streaming when the proxy is told to stop
        t0 = time.monotonic()
    finally:
        out, err = _stop(p)
        fails.shutdown()
    assert time.monotonic() - t0 < 10  # drained for 2 s, then cut: nothing hangs
    open_c.close()
    assert p.returncode == 0, err
    req, dec, meta = _read_log(log)
    assert len(req) == 13  # nothing lost
    assert by_id(req, "open1")["status"] == "abandoned" and by_id(req, "open1")["output_tokens"] >= 1
    by = req.set_index("client_id")
    assert (by.loc[[f"f{k}" for k in range(4)], "status"] == "ok").all()
    assert list(by.loc[[f"long{k}" for k in range(4)], "status"]) == ["error" if b else "ok" for b in on_b]
    assert (by.loc[[f"long{k}" for k in range(4)], "output_tokens"] >= 1).all()
    assert (by.loc[[f"g{k}" for k in range(4)], "instance_id"] == "a").all()
    dead = {e["instance_id"]: e["reason"] for e in meta["route"]["events"] if e["event"] == "dead"}
    assert set(dead) == {"gone", "five", "b"}
    assert "HTTP 500" in dead["five"] and "Connect" in dead["gone"]
    retried = dec[dec["attempt"] == 1]["request_id"].unique()
    assert len(retried) == 2  # f0 (gone) and f1 (five), each once
    assert not (dec["chosen"] & ~dec["alive"]).any()  # a dead backend is never chosen


class _Healthy(BaseHTTPRequestHandler):
    """A backend come back: /health answers 200."""

    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


def test_route_says_on_stderr_when_a_backend_dies_and_comes_back(tmp_path):
    """The proxy's console names a backend it marks dead, with the reason,
    and again when its /health brings it back (before, only the decision
    log written at shutdown said so)."""
    port_gone = free_base(1)  # nothing listens there yet
    pool = _route_pool(tmp_path, "one", [("gone", "qwen3-8b", f"http://127.0.0.1:{port_gone}")])
    port = free_base(1)
    p = _start(["route", "--pool", str(pool), "--router", "round-robin", "--listen", f"127.0.0.1:{port}"], tmp_path)
    back = None
    try:
        st, body, _ = post(port, "/v1/completions", {"prompt": "w5 w6", "max_tokens": 2}, {"X-Request-Id": "r0"})
        assert st == 502, body  # refused: the client gets vLLM's error body and the backend is marked dead
        assert get(port, "/health")[0] == 503
        back = ThreadingHTTPServer(("127.0.0.1", port_gone), _Healthy)
        threading.Thread(target=back.serve_forever, daemon=True).start()
        deadline = time.monotonic() + 15  # the health check asks every second
        while get(port, "/health")[0] != 200:
            assert time.monotonic() < deadline, "the backend was not revived"
            time.sleep(0.2)
    finally:
        out, err = _stop(p)
        if back is not None:
            back.shutdown()
    assert p.returncode == 0, err
    lines = err.splitlines()
    dead = [ln for ln in lines if ln.startswith("backend gone marked dead: ")]
    alive = [ln for ln in lines if ln == "backend gone alive again: GET /health answered 200"]
    assert len(dead) == 1 and len(alive) == 1, err
    assert "Connect" in dead[0], dead  # the reason, as the log has it
    assert lines.index(dead[0]) < lines.index(alive[0])
    assert "marked dead" not in out and "alive again" not in out  # stdout stays ready + the summary
