"""A misbehaving backend and malformed clients, for the tests that treat
``latroute route``'s backends and ``serve``/``route``'s clients as
untrusted input.

``FakeBackend`` is a plain threaded HTTP server on 127.0.0.1 whose every
answer is chosen by the test: ``fake.plan`` maps what the request asks
(the ``X-Request-Id`` the proxy forwards, or the path of a GET) to a
behaviour. Every endless behaviour is bounded in bytes and wall time, so
a test never outlives its budget even against a proxy that keeps reading.
"""
from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENDLESS_BYTES = 256 << 20  # an "endless" answer stops here (or at ENDLESS_S)
ENDLESS_S = 20.0


def completion(usage_raw: str) -> bytes:
    """A non-streamed completion whose ``usage.completion_tokens`` is the raw JSON text ``usage_raw``."""
    return (b'{"id": "cmpl-x", "object": "text_completion", "model": "m", "choices": [{"index": 0, '
            b'"text": " w1", "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "total_tokens": 4, '
            b'"completion_tokens": ' + usage_raw.encode() + b"}}")


def sse(*events: bytes) -> bytes:
    return b"".join(b"data: " + e + b"\n\n" for e in events)


TOKEN_EVENT = b'{"id": "cmpl-x", "choices": [{"index": 0, "text": " w1", "finish_reason": null}]}'


def frame(head: dict | bytes, body: bytes = b"", length: int | None = None) -> bytes:
    """A state-feed frame: the 8-byte length, the 4-byte header length, the header, the arrays."""
    hb = head if isinstance(head, bytes) else json.dumps(head).encode()
    payload = struct.pack("<I", len(hb)) + hb + body
    return struct.pack("<Q", len(payload) if length is None else length) + payload


class FakeBackend:
    """Behaviours (``plan[key]``), each a callable ``(handler) -> None``
    that writes the whole answer; ``key`` is the forwarded X-Request-Id's
    part before ``:`` for a POST, the path for a GET. Unplanned: a good
    small answer (one token)."""

    def __init__(self):
        self.plan: dict[str, object] = {}
        self.seen: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                fake.seen.append(self.path)
                act = fake.plan.get(self.path)
                if act is not None:
                    return act(self)
                if self.path == "/v1/models":
                    return self.answer(200, b'{"object": "list", "data": [{"id": "fake-model"}]}')
                if self.path == "/metrics":
                    return self.answer(200, b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n",
                                       "text/plain")
                return self.answer(200, b"")

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                rid = self.headers.get("X-Request-Id", "")
                fake.seen.append(rid)
                act = fake.plan.get(rid.split(":", 1)[0])
                if act is not None:
                    return act(self)
                if json.loads(body).get("stream"):
                    return self.answer(200, sse(TOKEN_EVENT, b"[DONE]"), "text/event-stream")
                return self.answer(200, completion("1"))

            def answer(self, status: int, body: bytes, kind: str = "application/json"):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def endless(self, head: bytes, piece: bytes, kind: str = "application/json"):
                """``head`` then ``piece`` again and again (no length: the body ends at the close)."""
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Connection", "close")
                self.end_headers()
                sent, deadline = 0, time.monotonic() + ENDLESS_S
                try:
                    self.wfile.write(head)
                    while sent < ENDLESS_BYTES and time.monotonic() < deadline:
                        self.wfile.write(piece)
                        sent += len(piece)
                        time.sleep(0)  # the GIL, for the test's own probes in this process
                except OSError:
                    pass  # the proxy hung up: what a bounded reader does

            def hold(self, head: bytes, kind: str = "application/octet-stream"):
                """``head``, then nothing more: the connection held open (up to ``ENDLESS_S``)."""
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    self.wfile.write(head)
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(ENDLESS_S)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def health_ms(port: int, timeout: float = 5.0) -> float:
    """Wall milliseconds ``GET /health`` took (inf if it did not answer)."""
    t0 = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("GET", "/health")
        c.getresponse().read()
        c.close()
    except OSError:
        return float("inf")
    return (time.monotonic() - t0) * 1e3


def raw_request(port: int, data: bytes, half_close: bool = False, timeout: float = 10.0) -> bytes:
    """Bytes sent as they are (a malformed request), the answer read to the
    close or ``timeout``; ``half_close``: shut our writing side after sending."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        return read_answer(s, timeout, half_close)


def read_answer(s: socket.socket, timeout: float, until_complete: bool = False) -> bytes:
    """What the server sends on ``s`` until it closes or ``timeout`` passes; ``until_complete``: stop
    at the end of one whole answer (a half-closed client's server may keep the connection)."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = s.recv(65536)
        except (TimeoutError, ConnectionResetError):
            break
        if not got:
            break
        out += got
        if until_complete and b"\r\n\r\n" in out and _complete(out):
            break
    return out


def _complete(raw: bytes) -> bool:
    head, _, body = raw.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def post_request(path: str, body: bytes, headers: dict[str, str] | None = None, close: bool = True) -> bytes:
    """A raw HTTP/1.1 POST with a correct Content-Length."""
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
             f"Content-Length: {len(body)}"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def status_of(raw: bytes) -> int:
    """The status code of a raw answer (0: none)."""
    try:
        return int(raw.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return 0
