"""One emulated instance's HTTP face: vLLM's OpenAI routes on aiohttp.

``/v1/completions`` and ``/v1/chat/completions`` (SSE streaming or one
JSON answer), ``/v1/models``, ``/health``, ``/metrics``. The request id is
``X-Request-Id`` when the client sends one (echoed back, as vLLM's
``--enable-request-id-headers`` does). Streams send every token at the end
of the step that produced it, or every ``stream_interval`` tokens (vLLM's
``--stream-interval``; the first and the last always at once). The pool's
front-end overhead (``frontend_overhead_s``, which the offline twin adds to
every TTFT) is waited once before the first token. A client that goes away
(the handler is cancelled, or a write fails) aborts its request in the
engine; a server shutting down ends open streams with an error event.
With prefix caching in the pool, each prompt's block hash ids are taken
from its token ids (the templated ones for chat) before it is submitted
(``harness.serve.prefix``).
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sys
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from harness.serve.engine import Served, ServedEngine
from harness.serve.metrics import EngineMetrics
from harness.serve.prefix import block_hashes
from harness.serve.protocol import (
    MAX_JSON_VALUES,
    MAX_REQUEST_BODY,
    ApiError,
    Parsed,
    detokenize,
    error_body,
    loads_bounded,
    parse,
    request_id,
)
from harness.serve.state_feed import encode

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
PARSE_ON_LOOP = 64 << 10  # bytes: a body up to this size is parsed in the event loop (well under a millisecond)


def openai_application(face) -> web.Application:
    """vLLM's routes on ``face``'s handlers (``completions``, ``chat``,
    ``models``, ``health``, ``metrics_text``): an emulated instance here,
    the routing proxy in ``harness.route.proxy``."""
    # a large body is checked in a worker thread (``json_body``); the interpreter passes from it to the event
    # loop within 1 ms (5 ms by default, which a reply that needs the interpreter a few times would pay each time)
    sys.setswitchinterval(min(sys.getswitchinterval(), 0.001))
    app = web.Application(client_max_size=MAX_REQUEST_BODY)
    app.add_routes([web.post("/v1/completions", face.completions),
                    web.post("/v1/chat/completions", face.chat),
                    web.get("/v1/models", face.models), web.get("/health", face.health),
                    web.get("/metrics", face.metrics_text)])
    return app


async def request_body(request: web.Request) -> bytes:
    """The request's body, read as it arrives (the event loop serves others
    meanwhile), or ``ApiError`` 413 past ``MAX_REQUEST_BODY``: at once when
    ``Content-Length`` says so, else when the bytes read pass it."""
    n = request.content_length
    too_big = ApiError(f"the request body is larger than {MAX_REQUEST_BODY} bytes", None, 413)
    if n is not None and n > MAX_REQUEST_BODY:
        raise too_big
    buf = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        buf += chunk
        if len(buf) > MAX_REQUEST_BODY:
            raise too_big
    return bytes(buf)


def _decoded(data: bytes, then):
    try:
        body = loads_bounded(data, values=MAX_JSON_VALUES)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(f"the request body is not JSON ({str(e)[:200]})") from None
    return then(body)


async def json_body(request: web.Request, then=lambda body: body):
    """``then`` of the request's JSON body, or ``ApiError`` (vLLM's 400; 413
    past ``MAX_REQUEST_BODY``): nested at most ``MAX_JSON_DEPTH`` deep and
    holding at most ``MAX_JSON_VALUES`` values. A body above
    ``PARSE_ON_LOOP`` bytes is checked, parsed and handed to ``then`` (the
    request's checks: tokenizing a long text is a Python loop) in a worker
    thread, so ``/health`` and other streams are answered meanwhile: the
    shape check and ``then`` yield the interpreter as Python code does,
    and the bounded ``json.loads`` holds it for tens of ms at most."""
    data = await request_body(request)
    if len(data) <= PARSE_ON_LOOP:
        return _decoded(data, then)
    return await asyncio.to_thread(_decoded, data, then)


class _Refusals(logging.Filter):
    """aiohttp logs a request its HTTP parser refuses (a bad Content-Length
    or chunk, too many or too long headers) with a traceback; its answer,
    a 400, is what vLLM's HTTP server sends too. One line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError | ConnectionError):
            record.msg, record.args, record.exc_info, record.exc_text = (
                f"refused a malformed HTTP request: {type(exc).__name__}: {str(exc)[:200]!r}", (), None, None)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class _HalfOpen(RequestHandler):
    """aiohttp closes a connection whose client half-closes (shuts its
    sending side after the request): the handler is cancelled and the
    client gets nothing. vLLM's server answers it, then closes; so does
    this one. A body cut short by the half-close fails its read."""

    def eof_received(self) -> bool:
        req = self._current_request
        if req is not None and not req.content.is_eof():
            req.content.set_exception(ConnectionResetError("the client closed its side before the body ended"))
        self.close()  # no further request on this connection: it ends after the answer
        return True  # the transport stays open for the answer


class _HalfOpenServer(web.Server):
    def __call__(self) -> RequestHandler:
        return _HalfOpen(self, loop=self._loop, **self._kwargs)


class Runner(web.AppRunner):
    """``web.AppRunner`` whose connections answer a half-closed client."""

    async def _make_server(self) -> web.Server:
        srv = await super()._make_server()
        srv.__class__ = _HalfOpenServer  # the same object, its handlers _HalfOpen
        return srv


def quiet_refusals() -> None:
    """Install ``_Refusals`` on aiohttp's server logger (once)."""
    log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _Refusals) for f in log.filters):
        log.addFilter(_Refusals())


def prometheus_response(text: bytes) -> web.Response:
    return web.Response(body=text, headers={"Content-Type": "text/plain; version=0.0.4"})


@dataclass
class ServerState:
    """What every instance of one ``serve`` process shares."""

    speed: float
    overhead_s: float
    stream_interval: int = 1
    closing: bool = False
    ids: itertools.count = field(default_factory=itertools.count)  # request ids in arrival order, pool-wide
    hash_block: int | None = None  # tokens per prefix hash id (None: no instance caches, no hashing)


class InstanceApp:
    def __init__(self, engine: ServedEngine, metrics: EngineMetrics, model: str, state: ServerState):
        self.engine, self.metrics, self.model, self.state = engine, metrics, model, state
        self.max_model_len = engine.spec.config.max_model_len
        self.created = int(time.time())

    def application(self) -> web.Application:
        app = openai_application(self)
        app.router.add_get("/latroute/state", self.state_feed)
        return app

    async def state_feed(self, request: web.Request) -> web.StreamResponse:
        """The engine's state after every change, as frames (``harness.serve.state_feed``)."""
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        changed = asyncio.Event()
        changed.set()  # the state now, at once
        self.engine.watchers.append(changed)
        try:
            while not self.state.closing:
                await changed.wait()
                changed.clear()
                await resp.write(encode(self.engine))
        finally:
            self.engine.watchers.remove(changed)
        return resp

    # --- simple routes
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self.state.closing else 200)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.model, "object": "model", "created": self.created, "owned_by": "vllm", "root": self.model,
            "parent": None, "max_model_len": self.max_model_len}]})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return prometheus_response(self.metrics.text())

    # --- generation
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if self.state.closing:
            return web.json_response(error_body("the server is shutting down", 503), status=503)
        try:
            client_id = request_id(request.headers.get("X-Request-Id")) or uuid.uuid4().hex
            p = await json_body(request, lambda body: parse(body, chat, self.model, self.max_model_len))
        except ApiError as e:
            return web.json_response(e.body(), status=e.status)
        block = self.state.hash_block
        hashes = block_hashes(p.prompt_ids, block, p.cache_salt) if block else None
        h = self.engine.submit(client_id, len(p.prompt_ids), p.max_tokens, hashes)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{client_id}"
        try:
            if p.stream:
                return await self._stream(request, h, p, rid)
            return await self._whole(h, p, rid)
        except ConnectionError:  # a write to a client that went away: as a cancelled handler, quietly
            raise asyncio.CancelledError from None
        finally:
            self.engine.abort(h)  # a no-op for a finished request; frees one whose client went away

    def _choice(self, p: Parsed, text: str, finish: str | None, first: bool) -> dict:
        if p.chat:
            delta = {"role": "assistant", "content": text} if first else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}

    def _usage(self, h: Served) -> dict:
        return {"prompt_tokens": h.prompt, "total_tokens": h.prompt + h.delivered, "completion_tokens": h.delivered,
                "prompt_tokens_details": {"cached_tokens": h.cached}}

    async def _first_wait(self, h: Served) -> None:
        """Until the first token's step end plus the front-end overhead (wall
        clock): a late delivery is not charged the overhead again."""
        if self.state.overhead_s > 0:
            clock = self.engine.clock
            delay = clock.wall(h.first_t + self.state.overhead_s) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _stream(self, request: web.Request, h: Served, p: Parsed, rid: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={**SSE_HEADERS, "X-Request-Id": h.client_id})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if p.chat else "text_completion"
        head = {"id": rid, "object": obj, "created": int(time.time()), "model": self.model}
        sent = 0
        pending: list[int] = []
        interval = self.state.stream_interval

        async def send(data: dict) -> None:
            await resp.write(b"data: " + json.dumps({**head, **data}, separators=(",", ":")).encode() + b"\n\n")

        async def flush(finish: str | None) -> None:
            nonlocal sent
            await send({"choices": [self._choice(p, detokenize(pending), finish, sent == 0)]})
            sent += len(pending)
            pending.clear()

        while True:
            kind, payload, finish = await h.queue.get()
            if kind == "tokens":  # the last ones carry the finish reason, as vLLM's last chunk does
                if sent == 0 and not pending:
                    await self._first_wait(h)
                pending.extend(payload)
                if sent == 0 or len(pending) >= interval or finish is not None:
                    await flush(finish)
                if finish is not None:
                    if p.include_usage:
                        await send({"choices": [], "usage": self._usage(h)})
                    await resp.write(b"data: [DONE]\n\n")
                    break
            else:  # "error": the engine refused it, or the server is stopping
                await resp.write(b"data: " + json.dumps(error_body(payload, 503 if self.state.closing else 400))
                                 .encode() + b"\n\n")
                await resp.write(b"data: [DONE]\n\n")
                break
        await resp.write_eof()
        return resp

    async def _whole(self, h: Served, p: Parsed, rid: str) -> web.Response:
        tokens: list[int] = []
        while True:
            kind, payload, finish = await h.queue.get()
            if kind == "tokens":
                if not tokens:
                    await self._first_wait(h)
                tokens.extend(payload)
                if finish is not None:
                    break
            else:
                status = 503 if self.state.closing else 400
                return web.json_response(error_body(payload, status), status=status)
        text = detokenize(tokens)
        if p.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": h.finish_reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": h.finish_reason,
                      "stop_reason": None}
            obj = "text_completion"
        return web.json_response({"id": rid, "object": obj, "created": int(time.time()), "model": self.model,
                                  "choices": [choice], "usage": self._usage(h)},
                                 headers={"X-Request-Id": h.client_id})
