"""A client's body is bounded and never stalls the server: past
``MAX_REQUEST_BODY`` it is refused with 413 and vLLM's error body (at once
from its Content-Length, or when a chunked one passes the limit), and a
body of the largest size is read as it arrives and checked in a worker
thread, so ``/health`` answers within 100 ms while it is sent and parsed,
on ``serve`` and on ``route``."""
from __future__ import annotations

import json
import socket
import time

import pytest

from tests.test_route_untrusted import HEALTH_MS, _vllm_error, _while, proxied, stopped_cleanly
from tests.test_serve_http import post, start_serve
from tests.untrusted_peers import FakeBackend, post_request, read_answer, status_of

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

# the bounds the bodies below are built against (4 MiB is the serve how-to's; the first test holds
# harness.serve.protocol to both, the servers' tests reach them only over HTTP)
MAX_REQUEST_BODY = 4 << 20
MAX_JSON_VALUES = 1 << 18


def test_value_count_is_bounded_before_parsing():
    from harness.serve import protocol
    from harness.serve.protocol import json_shape_ok, loads_bounded

    assert (protocol.MAX_REQUEST_BODY, protocol.MAX_JSON_VALUES) == (MAX_REQUEST_BODY, MAX_JSON_VALUES)
    ok = b'{"prompt": [' + b",".join([b"1"] * 1000) + b'], "max_tokens": 2}'
    assert json_shape_ok(ok) is None and loads_bounded(ok, values=MAX_JSON_VALUES)["max_tokens"] == 2
    many = b"[" + b",".join([b"0"] * (MAX_JSON_VALUES + 1)) + b"]"
    assert "more than" in json_shape_ok(many)
    with pytest.raises(ValueError, match="values"):
        loads_bounded(many, values=MAX_JSON_VALUES)
    # commas and brackets inside strings are not values: a long text with many commas is fine
    text = json.dumps({"prompt": "w1, " * (MAX_JSON_VALUES + 5) + "[" * 100})
    assert json_shape_ok(text) is None
    assert "nested deeper" in json_shape_ok(b"[" * 65 + b"]" * 65)


def _bodies() -> list[tuple[str, bytes, int]]:
    """(what, body, status): bodies of the largest size, and one past it."""
    head, tail = b'{"max_tokens": 2, "prompt": "', b'"}'
    text = head + b"w1 " * ((MAX_REQUEST_BODY - len(head) - len(tail)) // 3) + tail  # tokenized: too long
    ints = b"[" + b"0," * ((MAX_REQUEST_BODY - 2) // 2 - 1) + b"0]"  # over the value count
    strs = b"[" + b'"a",' * ((MAX_REQUEST_BODY - 2) // 4 - 1) + b'"a"]'  # strings: counted by the exact scan
    ids = b'{"max_tokens": 2, "prompt": [' + b",".join([b"7"] * (MAX_JSON_VALUES - 8)) + b"]}"  # parsed: too long
    over = text[:-2] + b"w1" + tail
    assert max(len(text), len(ints), len(strs)) <= MAX_REQUEST_BODY < len(over)
    return [("4 MiB text prompt", text, 400), ("4 MiB of ints", ints, 400), ("4 MiB of strings", strs, 400),
            ("token ids at the value bound", ids, 400),
            ("one byte past the limit", over, 413)]


def _send_slowly(port: int, raw: bytes, chunked: bool = False) -> bytes:
    """``raw``'s head, then its body in 64 KiB pieces over about a second; the answer to the close."""
    head, _, body = raw.partition(b"\r\n\r\n")
    if chunked:
        head = b"\r\n".join(h for h in head.split(b"\r\n") if not h.lower().startswith(b"content-length"))
        head += b"\r\nTransfer-Encoding: chunked"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head + b"\r\n\r\n")
        try:
            for k in range(0, len(body), 1 << 16):
                piece = body[k:k + (1 << 16)]
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                time.sleep(0.015)
            if chunked:
                s.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # refused before the end: the answer is waiting
        return read_answer(s, 30)


def _bounded(port: int) -> None:
    for what, body, status in _bodies():
        raw = post_request("/v1/completions", body)
        for chunked in (False, True):
            got, worst = _while(port, lambda raw=raw, chunked=chunked: _send_slowly(port, raw, chunked))
            assert status_of(got) == status, (what, chunked, got[:300])
            _vllm_error(json.loads(got.split(b"\r\n\r\n", 1)[1]), status)
            assert worst < HEALTH_MS, (what, chunked, worst)
    # too large by its Content-Length: refused before a byte of the body is read
    got = _send_head_only(port, MAX_REQUEST_BODY + 1)
    assert status_of(got) == 413, got[:300]


def _send_head_only(port: int, length: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(post_request("/v1/completions", b"").replace(b"Content-Length: 0", b"Content-Length: %d" % length))
        out = b""
        while b"\r\n\r\n" not in out:
            got = s.recv(65536)
            if not got:
                break
            out += got
        return out


def test_serve_bounds_a_clients_body(tmp_path):
    with stopped_cleanly(*start_serve(tmp_path)) as run:
        _bounded(run.port)
        st, body, _ = post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2})
    assert st == 200 and body["usage"]["completion_tokens"] == 2


def test_route_bounds_a_clients_body(tmp_path):
    with proxied(tmp_path, FakeBackend()) as run:
        _bounded(run.port)
        assert post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2})[0] == 200
