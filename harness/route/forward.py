"""One request sent to one backend, and what the proxy reads from its answer
on the way back (the answer itself is passed on byte for byte).

A backend *fails* (``BackendFailed``) when it cannot be reached, answers a
5xx status, stays silent past the read timeout, or its stream breaks or
ends without vLLM's ``data: [DONE]``; the proxy then counts it dead until
its ``/health`` answers again. A 4xx is the request's fault, not the
backend's: it goes back to the client unchanged.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding",
              "proxy-connection", "te", "trailer", "upgrade"}
PASSED_HEADERS = ("content-type", "x-request-id", "cache-control")  # of a backend's answer, back to the client


class BackendFailed(Exception):
    """The backend, not the request, failed."""

    def __init__(self, reason: str, status: int = 502):
        super().__init__(reason)
        self.reason, self.status = reason, status


@dataclass
class StreamRead:
    """What the proxy learns from an SSE stream it passes on: content
    chunks (vLLM sends one per token at ``--stream-interval 1``), the usage
    block's completion tokens when the client asked for it, an error event,
    the end marker."""

    buf: bytes = b""
    chunks: int = 0
    usage_tokens: int = -1
    error: str | None = None
    error_code: int | None = None
    done: bool = False

    def feed(self, data: bytes) -> int:
        """Read ``data``; returns the content chunks it completed."""
        self.buf += data
        new = 0
        while True:
            cut = self.buf.find(b"\n\n")
            if cut < 0:
                return new
            event, self.buf = self.buf[:cut], self.buf[cut + 2:]
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                    continue
                new += self._event(payload)

    def _event(self, payload: bytes) -> int:
        try:
            obj = json.loads(payload)
        except ValueError:
            return 0
        if not isinstance(obj, dict):
            return 0
        if "error" in obj:
            err = obj["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)[:200]
            code = err.get("code") if isinstance(err, dict) else None
            self.error_code = code if isinstance(code, int) else None
            return 0
        usage = obj.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        n = 0
        for c in obj.get("choices") or ():
            if not isinstance(c, dict):
                continue
            text = c.get("text")
            if text is None and isinstance(c.get("delta"), dict):
                text = c["delta"].get("content")
            if text:
                n += 1
        self.chunks += n
        return n

    @property
    def backend_error(self) -> bool:
        """The error event is the backend's (5xx, or no code), not the request's."""
        return self.error is not None and (self.error_code is None or self.error_code >= 500)

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens >= 0 else self.chunks


def whole_tokens(body: bytes) -> int:
    """A non-streamed answer's completion tokens (its usage), 0 if unread."""
    try:
        u = json.loads(body).get("usage") or {}
        return int(u.get("completion_tokens", 0))
    except (ValueError, AttributeError, TypeError):
        return 0


def forwarded_headers(headers) -> dict[str, str]:
    """The client's headers that go on to the backend (hop-by-hop ones and
    latroute's own stay behind)."""
    return {k: v for k, v in headers.items()
            if k.lower() not in HOP_BY_HOP and not k.lower().startswith("x-latroute-")}


def passed_back(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in PASSED_HEADERS}
