"""``latroute route`` against a backend that misbehaves and clients that
send what they should not: the proxy as a subprocess on 127.0.0.1, the
backend a fake written here (``tests.support.misbehaving_peers``), every request
over HTTP. What must hold whatever they send: the client gets vLLM's
error body, the backend is marked dead with the reason, ``/health``
answers within 100 ms while it happens, no traceback reaches stderr, and
SIGTERM writes the decision log whole (every request, exit 0)."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from harness.live.ports import free_port_base
from tests.harness.route.test_route_live import _read_log, _start, _stop
from tests.harness.serve.test_serve_http import get, post
from tests.support.misbehaving_peers import (
    TOKEN_EVENT,
    FakeBackend,
    completion,
    frame,
    health_ms,
    post_request,
    raw_request,
    sse,
    status_of,
)

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

HEALTH_MS = 100.0
QUALITY = {"x-latroute-quality": "qwen3-0.6b=0.5"}


def _pool(tmp: Path, url: str, name: str = "fake") -> Path:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"name": name, "frontend_overhead_s": 0.0, "instances": [
        {"instance_id": "f0", "model": "qwen3-0.6b", "profile": "qwen3-0.6b-h100", "num_kv_blocks": 20000,
         "max_num_batched_tokens": 8192, "max_num_seqs": 64, "max_model_len": 4096, "url": url}]}))
    return path


def _proxy(tmp: Path, fake: FakeBackend, log: Path, *extra: str):
    port = free_port_base(1)
    p = _start(["route", "--pool", str(_pool(tmp, fake.url)), "--router", "shortest-queue", "--listen",
                f"127.0.0.1:{port}", "--log", str(log), *extra], tmp)
    return p, port


def _revived(port: int, timeout: float = 5.0) -> None:
    """Until the proxy's /health is 200 again (its dead backend revived by its /health)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if get(port, "/health")[0] == 200:
            return
        time.sleep(0.05)
    raise AssertionError("the backend was not revived")


def _while(port: int, call) -> tuple[object, float]:
    """``call()`` in a thread; meanwhile /health probed every 50 ms: (its result, the slowest probe ms)."""
    out = {}
    t = threading.Thread(target=lambda: out.__setitem__("r", call()))
    t.start()
    worst = 0.0
    deadline = time.monotonic() + 30
    while t.is_alive() and time.monotonic() < deadline:
        worst = max(worst, health_ms(port))
        time.sleep(0.05)
    t.join(30)
    assert not t.is_alive(), "the request never ended"
    return out["r"], worst


def _vllm_error(body, status: int) -> None:
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == status


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, err[-3000:]


BAD_USAGE = ["1000000000000000000000000000000", "1e300", "Infinity", "-5", "7.5", '"3"', "9"]


def test_route_survives_what_a_backend_answers(tmp_path):
    """Usage counts out of range, an endless answer, a stream of chunks
    without tokens, a streamed usage of 1e300: each fails its request with
    vLLM's error body and the backend with its reason, /health stays
    quick, and the log has every request."""
    fake = FakeBackend()
    for k, raw in enumerate(BAD_USAGE):
        fake.plan[f"usage{k}"] = lambda h, raw=raw: h.answer(200, completion(raw))
    fake.plan["endless"] = lambda h: h.endless(b'{"usage": {"completion_tokens": 1}, "x": "', b"a" * 65536)
    fake.plan["tokenless"] = lambda h: h.endless(b"", b'data: {"choices": []}\n\n' * 2700, "text/event-stream")
    fake.plan["sseusage"] = lambda h: h.answer(200, sse(TOKEN_EVENT, b'{"choices": [], "usage": '
                                                        b'{"completion_tokens": 1e300}}', b"[DONE]"),
                                               "text/event-stream")
    fake.plan["deepjson"] = lambda h: h.answer(200, b"[" * 100_000 + b"]" * 100_000)
    log = tmp_path / "log"
    p, port = _proxy(tmp_path, fake, log)
    sent = []
    try:
        for key, stream in [(f"usage{k}", False) for k in range(len(BAD_USAGE))] + [
                ("endless", False), ("tokenless", True), ("sseusage", True), ("deepjson", False)]:
            rid = f"{key}:1"
            sent.append(rid)
            (status, body, _), worst = _while(port, lambda rid=rid, stream=stream: post(
                port, "/v1/completions", {"prompt": "w1 w2 w3", "max_tokens": 8, "stream": stream},
                {"X-Request-Id": rid, **QUALITY}))
            assert worst < HEALTH_MS, f"{key}: /health took {worst:.0f} ms"
            if stream and status == 200:  # the first token went out: the failure is an error event
                continue
            assert status == 502, (key, status, body)
            _vllm_error(body, 502)
            _revived(port)
        st, body, _ = post(port, "/v1/completions", {"prompt": "w1", "max_tokens": 8},
                           {"X-Request-Id": "good:1", **QUALITY})
        assert st == 200 and body["usage"]["completion_tokens"] == 1
        sent.append("good:1")
    finally:
        out, err = _stop(p)
        fake.close()
    assert p.returncode == 0, err[-3000:]
    _no_traceback(err)
    req, dec, meta = _read_log(log)
    assert sorted(req["client_id"]) == sorted(sent)  # every request, whole
    rows = req.set_index("client_id")
    assert (rows.drop(index="good:1")["status"] == "error").all()
    assert rows.loc["good:1", "status"] == "ok" and rows.loc["good:1", "output_tokens"] == 1
    assert (req["output_tokens"] <= 8).all()
    reasons = " | ".join(e["reason"] for e in meta["route"]["events"] if e["event"] == "dead")
    for needle in ("completion_tokens", "longer than", "without a token", "not JSON"):
        assert needle in reasons, reasons


def test_refused_requests_use_no_capacity(tmp_path):
    """--capacity 3: five requests refused (no quality, under --quality
    request; bad JSON; a bad X-Request-Id), then three good ones all served."""
    fake = FakeBackend()
    p, port = _proxy(tmp_path, fake, tmp_path / "log", "--capacity", "3", "--quality", "request")
    try:
        for _ in range(3):
            assert post(port, "/v1/completions", {"prompt": "w1", "max_tokens": 2})[0] == 400
        assert post(port, "/v1/completions", b"{nope", QUALITY)[0] == 400
        assert post(port, "/v1/completions", {"prompt": "w1", "max_tokens": 2},
                    {"X-Request-Id": "a b", **QUALITY})[0] == 400
        for k in range(3):
            st, body, _ = post(port, "/v1/completions", {"prompt": "w1", "max_tokens": 2},
                               {"X-Request-Id": f"ok{k}", **QUALITY})
            assert st == 200, body
        st, body, _ = post(port, "/v1/completions", {"prompt": "w1", "max_tokens": 2}, QUALITY)
        assert st == 503 and "capacity" in body["error"]["message"]
    finally:
        out, err = _stop(p)
        fake.close()
    assert p.returncode == 0
    _no_traceback(err)


def _malformed(port: int) -> list[tuple[str, bytes, int]]:
    """(what, raw request, the status vLLM's server answers) of every
    malformed client request: 400 for the body and the request id, the
    HTTP layer's refusal (4xx) for the framing."""
    deep = b"[" * 100_000 + b"]" * 100_000
    cases = [("json 2000 deep", b'{"prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400),
             ("json 100000 deep", deep, 400),
             ("prompt 990 deep", b'{"prompt": ' + b"[" * 990 + b"1" + b"]" * 990 + b', "max_tokens": 2}', 400),
             ("prompt 3 deep", b'{"prompt": [[[1]]], "max_tokens": 2}', 400)]
    for text in (5, None, ["w1"], {"a": 1}):
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}], "max_tokens": 2}
        cases.append((f"content part text {text!r}", ("chat", json.dumps(body).encode()), 400))
    good = json.dumps({"prompt": "w1 w2", "max_tokens": 2}).encode()
    out = []
    for what, body, status in cases:
        path = "/v1/completions"
        if isinstance(body, tuple):
            path, body = "/v1/chat/completions", body[1]
        out.append((what, post_request(path, body), status))
    out += [
        ("request id 10 KB", post_request("/v1/completions", good, {"X-Request-Id": "r" * 10_000}), 400),
        ("request id 300 chars", post_request("/v1/completions", good, {"X-Request-Id": "r" * 300}), 400),
        ("request id latin-1", post_request("/v1/completions", good, {"X-Request-Id": "caf\xe9"}), 400),
        ("request id CR", post_request("/v1/completions", good, {"X-Request-Id": "a\rb"}), 400),
        ("negative content-length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n"
                                    b"Connection: close\r\n\r\n" + good, 400),
        ("bad chunked", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                        b"Connection: close\r\n\r\nzz\r\n" + good + b"\r\n0\r\n\r\n", 400),
        ("thousands of headers", post_request("/v1/completions", good,
                                              {f"X-H{k}": "v" for k in range(5000)}), 400),
    ]
    return out


def _refused_quietly(port: int) -> None:
    for what, raw, status in _malformed(port):
        got = raw_request(port, raw)
        code = status_of(got)
        assert code == status or (status == 400 and 400 <= code < 500 and code != 404), (what, got[:300])
        if code == 400 and b"application/json" in got.split(b"\r\n\r\n")[0]:
            _vllm_error(json.loads(got.split(b"\r\n\r\n", 1)[1]), 400)
        assert health_ms(port) < HEALTH_MS, what
    # a client that half-closes after its request still gets the answer
    body = json.dumps({"prompt": "w1 w2", "max_tokens": 2}).encode()
    got = raw_request(port, post_request("/v1/completions", body, {"X-Request-Id": "half-1"}, close=False),
                      half_close=True)
    assert status_of(got) == 200, got[:300]


def test_route_refuses_malformed_clients_quietly(tmp_path):
    fake = FakeBackend()
    log = tmp_path / "log"
    p, port = _proxy(tmp_path, fake, log)
    try:
        _refused_quietly(port)
        assert post(port, "/v1/completions", {"prompt": "w1", "max_tokens": 2}, {"X-Request-Id": "after"})[0] == 200
    finally:
        out, err = _stop(p)
        fake.close()
    assert p.returncode == 0, err[-2000:]
    _no_traceback(err)
    req, _, _ = _read_log(log)
    assert sorted(req["client_id"]) == ["after", "half-1"] and (req["status"] == "ok").all()


def _metrics_page(running: str) -> bytes:
    return f"vllm:num_requests_running {running}\nvllm:num_requests_waiting 0\n".encode()


def test_metrics_view_bounds_gauges_and_keeps_polling(tmp_path):
    """Gauges of 1e12 and 100,000 running requests are bounded by the
    instance's max_num_seqs (decisions stay quick, SIGTERM is obeyed); a NaN
    or +Inf gauge fails the backend with the reason, and the poller lives
    on: a good page after it is read (its residents reach the log)."""
    fake = FakeBackend()
    page = {"v": _metrics_page("1e12")}
    fake.plan["/metrics"] = lambda h: h.answer(200, page["v"], "text/plain")
    log = tmp_path / "log"
    p, port = _proxy(tmp_path, fake, log, "--view", "metrics", "--poll-interval", "20")
    try:
        for k, value in enumerate(["1e12", "100000", "NaN", "+Inf", "5"]):
            page["v"] = _metrics_page(value)
            time.sleep(0.3)
            _revived(port)
            time.sleep(0.1)
            t0 = time.monotonic()
            st, body, _ = post(port, "/v1/completions", {"prompt": "w1", "max_tokens": 2},
                               {"X-Request-Id": f"m{k}"})
            assert time.monotonic() - t0 < 2.0 and health_ms(port) < HEALTH_MS
            assert st in (200, 503), body
    finally:
        out, err = _stop(p)
        fake.close()
    assert p.returncode == 0, err[-2000:]
    _no_traceback(err)
    req, dec, meta = _read_log(log)
    assert len(req) == 5
    assert dec["residents"].max() <= 64 + 5  # stand-ins bounded by max_num_seqs
    last = dec[dec["request_id"] == req.set_index("client_id").loc["m4", "request_id"]]
    assert (last["residents"] >= 5).all()  # the poller read the page after the NaN and the +Inf
    reasons = " | ".join(e["reason"] for e in meta["route"]["events"])
    assert "nan" in reasons.lower() and "inf" in reasons.lower(), reasons


def _good_head(rows: int = 0, cap: int = 8, width: int | None = None) -> tuple[dict, bytes]:
    from estimators.engine.layout import NS, S_CAP, S_NFREE_SLOTS
    from estimators.engine.state import SchedState
    from harness.twin.pools.spec import load_pool

    cfg = load_pool("qwen3-h100").instances[0]
    w = SchedState.new(cfg, capacity=8).req.shape[1] if width is None else width
    sc = np.zeros(NS, dtype=np.int64)
    sc[S_CAP], sc[S_NFREE_SLOTS] = cap, cap
    arrays = [np.zeros(rows * w, dtype=np.int64), sc, np.zeros(cap, dtype=np.int64), np.zeros(cap, dtype=np.int64),
              np.arange(cap, dtype=np.int64)]
    head = {"t": 0.0, "cap": cap, "width": w, "rows": rows, "n_inbox": 0, "infl_n": 0, "infl_start": None,
            "wake_s": None, "ids": {}, "sizes": [int(a.size) for a in arrays] + [0, 0, 0, 0]}
    return head, b"".join(a.tobytes() for a in arrays)


@pytest.mark.parametrize("kind", ["garbage", "header-not-json", "rows-lie", "cap-1e12", "length-2^60"])
def test_exact_view_refuses_a_malformed_frame(tmp_path, kind):
    """A frame the proxy cannot use fails the backend (logged with the
    reason), the client's request gets vLLM's error body (never a bare 500)
    and its row is closed, not left open; a 2^60 length is refused, not
    waited for while the view is reported current."""
    head, body = _good_head()
    if kind == "garbage":
        bad = frame(b"\xff" * 3, b"\x00" * 5)
    elif kind == "header-not-json":
        bad = frame(b"{not json", body)
    elif kind == "rows-lie":
        bad = frame({**head, "rows": 5}, body)
    elif kind == "cap-1e12":
        bad = frame({**head, "cap": 10**12}, body)
    else:
        bad = frame(head, body, length=1 << 60)
    fake = FakeBackend()
    fake.plan["/latroute/state"] = lambda h: h.endless(bad, b"\x00" * 4096, "application/octet-stream")
    log = tmp_path / "log"
    p, port = _proxy(tmp_path, fake, log, "--view", "exact")
    try:
        time.sleep(0.5)
        st, body_, _ = post(port, "/v1/completions", {"prompt": "w1", "max_tokens": 2}, {"X-Request-Id": "x1"})
        assert st in (200, 503), body_
        if st == 503:
            _vllm_error(body_, 503)
        assert health_ms(port) < HEALTH_MS
    finally:
        out, err = _stop(p)
        fake.close()
    assert p.returncode == 0, err[-2000:]
    _no_traceback(err)
    req, dec, meta = _read_log(log)
    assert list(req["status"]) != ["open"] and len(req) == 1
    dead = [e for e in meta["route"]["events"] if e["event"] == "dead"]
    assert dead and "state feed refused" in dead[0]["reason"], meta["route"]["events"]


def test_clients_that_leave_mid_stream_end_their_requests(tmp_path):
    """40 clients leave a proxied stream after its first token: each row is
    ``abandoned``, nothing stays in flight, nothing reaches stderr."""
    from tests.harness.serve.test_serve_untrusted import _leave_mid_stream

    fake = FakeBackend()
    fake.plan["gone"] = lambda h: h.endless(b"", sse(TOKEN_EVENT), "text/event-stream")
    log = tmp_path / "log"
    p, port = _proxy(tmp_path, fake, log)
    try:
        for k in range(40):
            _leave_mid_stream(port, k)
        deadline = time.monotonic() + 10
        while b'latroute_route_in_flight{instance_id="f0"} 0.0' not in get(port, "/metrics")[1]:
            assert time.monotonic() < deadline, "requests left in flight after their clients left"
            time.sleep(0.1)
        assert get(port, "/health")[0] == 200  # a client leaving is not the backend's fault
    finally:
        out, err = _stop(p)
        fake.close()
    assert p.returncode == 0, err[-2000:]
    _no_traceback(err)
    req, _, meta = _read_log(log)
    assert len(req) == 40 and (req["status"] == "abandoned").all()
    assert not [e for e in meta["route"]["events"] if e["event"] == "dead"]


@pytest.mark.parametrize("models", [b"[" * 200_000 + b"]" * 200_000, b'{"data": [{"id": "m", "max_model_len": 1e300}]}',
                                    b'{"data": [{"id": "m", "max_model_len": 1000000000000000000000000000000}]}',
                                    b'{"data": [7]}', b'{"data": [{"id": "a b\\n"}]}'],
                         ids=["deep", "float-len", "huge-len", "not-an-entry", "bad-name"])
def test_bare_backends_models_answer_is_checked(tmp_path, models):
    """Bare --backends take each model from the backend's /v1/models: an
    answer the proxy cannot use refuses --backends in one line (exit 2),
    before anything binds."""
    import subprocess
    import sys

    from tests.harness.route.test_route_live import ENV, ROOT

    fake = FakeBackend()
    fake.plan["/v1/models"] = lambda h: h.answer(200, models)
    try:
        r = subprocess.run([sys.executable, "-m", "harness.cli", "route", "--backends", fake.url, "--profile",
                            "qwen3-0.6b-h100", "--quality", "request", "--router", "shortest-queue", "--listen",
                            f"127.0.0.1:{free_port_base(1)}"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=60)
    finally:
        fake.close()
    assert r.returncode == 2, r.stderr[-2000:]
    assert "--backends" in r.stderr and "/v1/models" in r.stderr and len(r.stderr.strip().splitlines()) == 1
