"""``latroute serve`` against clients that send what they should not: a
real server subprocess on 127.0.0.1, malformed requests as raw bytes,
clients that leave mid-stream or half-close. Each is answered as vLLM's
server answers it (400 with vLLM's error body, or the HTTP layer's
refusal), no traceback reaches stderr, nothing stays running, and SIGTERM
writes the recording whole."""
from __future__ import annotations

import json
import socket
import time

import pytest

from tests.test_route_untrusted import _refused_quietly, _what_broke, stopped_cleanly
from tests.test_serve_http import gauge, post, start_serve
from tests.untrusted_peers import post_request, raw_request, status_of
from traces.store import open_trace

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
    with stopped_cleanly(*start_serve(tmp_path, "--record", str(tmp_path / "rec")), check=False) as run:
        problems = _refused_quietly(run)
        # 40 clients that leave mid-stream: their requests end, nothing is left running
        for k in range(40):
            _leave_mid_stream(run.port, k)
        deadline = time.monotonic() + 10
        while (left := gauge(run.port, "vllm:num_requests_running") + gauge(run.port, "vllm:num_requests_waiting")) > 0:
            if time.monotonic() > deadline:
                problems["40 clients leave mid-stream"] = f"{left:g} requests left running after their clients left"
                break
            time.sleep(0.1)
        if "Traceback" in (err := run.stderr_since()):
            problems["40 clients leave mid-stream"] = "traceback: " + _what_broke(err)[:200]
        st, body, _ = post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2}, {"X-Request-Id": "after"})
    assert not problems, "".join(f"\n  {what}: {why}" for what, why in problems.items())
    assert st == 200 and body["usage"]["completion_tokens"] == 2
    run.clean()
    req = open_trace(tmp_path / "rec").read("requests")
    ids = set(req["client_id"])
    assert {"after", "half-1"} <= ids and {f"gone:{k}" for k in range(40)} <= ids
    assert len(req) == 42


def test_a_latin1_request_id_costs_no_recording(tmp_path):
    """One request whose X-Request-Id holds a Latin-1 byte is refused with
    400; the recording of the others is written whole at SIGTERM."""
    with stopped_cleanly(*start_serve(tmp_path, "--record", str(tmp_path / "rec"))) as run:
        before = post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2}, {"X-Request-Id": "before"})[0]
        latin1 = raw_request(run.port + 1, post_request("/v1/completions", b'{"prompt": "w1", "max_tokens": 2}',
                                                        {"X-Request-Id": "\xe9t\xe9"}))
        after = post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2}, {"X-Request-Id": "after"})[0]
    assert (before, status_of(latin1), after) == (200, 400, 200), latin1[:300]
    assert sorted(open_trace(tmp_path / "rec").read("requests")["client_id"]) == ["after", "before"]
