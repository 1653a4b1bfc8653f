"""``latroute serve`` against clients that send what they should not: a
real server subprocess on 127.0.0.1, malformed requests as raw bytes,
clients that leave mid-stream or half-close. Each is answered as vLLM's
server answers it (400 with vLLM's error body, or the HTTP layer's
refusal), no traceback reaches stderr, nothing stays running, and SIGTERM
writes the recording whole."""
from __future__ import annotations

import http.client
import json
import socket
import time

import pytest

from tests.harness.route.test_route_live import _stop
from tests.harness.route.test_route_untrusted import _no_traceback, _refused_quietly
from tests.harness.serve.test_serve_http import gauge, post, start_serve
from tests.support.misbehaving_peers import post_request, raw_request, status_of

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")


def _leave_mid_stream(port: int, k: int) -> None:
    body = json.dumps({"prompt": "w1 w2 w3", "max_tokens": 2000, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(post_request("/v1/completions", body, {"X-Request-Id": f"gone:{k}"}, close=False))
    got = b""
    while b"data:" not in got:
        got += s.recv(4096)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
    s.close()


def test_serve_refuses_malformed_clients_and_keeps_the_recording(tmp_path):
    p, base = start_serve(tmp_path, "--record", str(tmp_path / "rec"))
    try:
        _refused_quietly(base)
        # 40 clients that leave mid-stream: their requests end, nothing is left running
        for k in range(40):
            _leave_mid_stream(base, k)
        deadline = time.monotonic() + 10
        while gauge(base, "vllm:num_requests_running") + gauge(base, "vllm:num_requests_waiting") > 0:
            assert time.monotonic() < deadline, "requests left running after their clients left"
            time.sleep(0.1)
        st, body, _ = post(base, "/v1/completions", {"prompt": "w1", "max_tokens": 2}, {"X-Request-Id": "after"})
        assert st == 200 and body["usage"]["completion_tokens"] == 2
        c = http.client.HTTPConnection("127.0.0.1", base + 1, timeout=10)  # another instance, a raw Latin-1 id
        got = raw_request(base + 1, post_request("/v1/completions", b'{"prompt": "w1", "max_tokens": 2}',
                                                 {"X-Request-Id": "\xe9t\xe9"}))
        assert status_of(got) == 400
        c.close()
    finally:
        out, err = _stop(p)
    assert p.returncode == 0, err[-3000:]
    _no_traceback(err)
    from traces.store import open_trace

    req = open_trace(tmp_path / "rec").read("requests")
    ids = set(req["client_id"])
    assert {"after", "half-1"} <= ids and {f"gone:{k}" for k in range(40)} <= ids
    assert len(req) == 42
