"""One request sent to one backend, and what the proxy reads from its answer
on the way back (the answer itself is passed on byte for byte).

A backend *fails* (``BackendFailed``) when it cannot be reached, answers a
5xx status, stays silent past the read timeout, or its stream breaks or
ends without vLLM's ``data: [DONE]``; the proxy then counts it dead until
its ``/health`` answers again. A 4xx is the request's fault, not the
backend's: it goes back to the client unchanged.

A backend is untrusted input like a client: what the proxy reads from it
is bounded before it reaches the ledger or the log -- an answer body
(``MAX_BODY``), one SSE event (``MAX_EVENT``), the bytes of a stream
before its first token (``MAX_HELD``), and every token count (an integer
in [0, ``max_tokens``]: ``usage.completion_tokens`` is the backend's word,
and a count the request could not have produced is a broken backend). A
bound broken is ``BackendFailed`` with the reason, as a backend that dies.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import ClientError

from harness.serve.protocol import loads_bounded

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding",
              "proxy-connection", "te", "trailer", "upgrade"}
PASSED_HEADERS = ("content-type", "x-request-id", "cache-control")  # of a backend's answer, back to the client


MAX_BODY = 16 << 20  # a non-streamed answer: vLLM's for max_model_len tokens of text is far below
MAX_EVENT = 1 << 20  # one SSE event (one chunk's JSON)
MAX_HELD = 1 << 20  # stream bytes passed on before any token (held back for a retry)
_COUNTED = (b'"text"', b'"content"', b'"usage"', b'"error"')  # keys of the events StreamRead reads


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

    max_tokens: int = 1 << 24
    buf: bytearray = field(default_factory=bytearray)
    chunks: int = 0
    usage_tokens: int = -1
    error: str | None = None
    error_code: int | None = None
    done: bool = False

    def feed(self, data: bytes) -> int:
        """Read ``data``; returns the content chunks it completed
        (``BackendFailed`` for an event above ``MAX_EVENT`` or a count out
        of bounds). Events that cannot count (no text, content, usage or
        error key) are not parsed: a backend may send many."""
        start = max(len(self.buf) - 1, 0)  # a cut "\n\n" may straddle the chunk boundary
        self.buf += data
        cut = self.buf.rfind(b"\n\n", start)
        if cut < 0:
            if len(self.buf) > MAX_EVENT:
                raise BackendFailed(f"an SSE event longer than {MAX_EVENT} bytes")
            return 0
        block = bytes(self.buf[:cut])
        del self.buf[:cut + 2]
        if len(self.buf) > MAX_EVENT:
            raise BackendFailed(f"an SSE event longer than {MAX_EVENT} bytes")
        if b"[DONE]" not in block and not any(k in block for k in _COUNTED):
            return 0  # nothing here counts: the events need not be split
        new = 0
        for event in block.split(b"\n\n"):
            if len(event) > MAX_EVENT:
                raise BackendFailed(f"an SSE event longer than {MAX_EVENT} bytes")
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    self.done = True
                elif any(k in payload for k in _COUNTED):
                    new += self._event(payload)
        return new

    def _event(self, payload: bytes) -> int:
        try:
            obj = loads_bounded(payload)
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
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            self.usage_tokens = token_count(usage["completion_tokens"], self.max_tokens)
        n = 0
        for c in obj.get("choices") or ():
            if not isinstance(c, dict):
                continue
            text = c.get("text")
            if text is None and isinstance(c.get("delta"), dict):
                text = c["delta"].get("content")
            if text:
                n += 1
        if self.chunks + n > self.max_tokens:
            raise BackendFailed(f"more content chunks than max_tokens ({self.max_tokens})")
        self.chunks += n
        return n

    @property
    def backend_error(self) -> bool:
        """The error event is the backend's (5xx, or no code), not the request's."""
        return self.error is not None and (self.error_code is None or self.error_code >= 500)

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens >= 0 else self.chunks


def token_count(v, max_tokens: int) -> int:
    """A backend's ``completion_tokens``: an integer in [0, max_tokens], else
    ``BackendFailed`` (no request of this one's could have produced it)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= max_tokens:
        raise BackendFailed(f"usage.completion_tokens {str(v)[:40]} is not an integer in [0, {max_tokens}]")
    return v


def whole_tokens(body: bytes, max_tokens: int) -> int:
    """A non-streamed answer's completion tokens (its usage), 0 if it has no
    usage; ``BackendFailed`` for a count out of bounds or a body that is not
    a JSON object."""
    try:
        doc = loads_bounded(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BackendFailed(f"the answer is not JSON ({str(e)[:80]})") from None
    if not isinstance(doc, dict):
        raise BackendFailed("the answer is not a JSON object")
    u = doc.get("usage")
    if not isinstance(u, dict) or u.get("completion_tokens") is None:
        return 0
    return token_count(u["completion_tokens"], max_tokens)


def forwarded_headers(headers) -> dict[str, str]:
    """The client's headers that go on to the backend (hop-by-hop ones and
    latroute's own stay behind)."""
    return {k: v for k, v in headers.items()
            if k.lower() not in HOP_BY_HOP and not k.lower().startswith("x-latroute-")}


def passed_back(headers) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in PASSED_HEADERS}


async def bounded_read(resp, limit: int) -> bytes:
    """A backend's answer body, at most ``limit`` bytes (``BackendFailed``
    beyond, or when it breaks off), read chunk by chunk with the event loop
    free between chunks."""
    parts, size = [], 0
    try:
        async for chunk in resp.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > limit:
                raise BackendFailed(f"an answer longer than {limit} bytes")
            parts.append(chunk)
            await asyncio.sleep(0)
    except (ClientError, TimeoutError, OSError) as e:
        raise BackendFailed(f"the answer broke off ({type(e).__name__})") from None
    return b"".join(parts)
