"""The proxy's HTTP face and its routing step.

vLLM's OpenAI routes, as ``latroute serve`` answers them (the request is
checked by the same ``harness.serve.protocol.parse``, refusals carry
vLLM's error body): ``/v1/completions`` and ``/v1/chat/completions``
(streamed or not), ``/v1/models`` (the backends' models), ``/health`` (200
while a backend is alive) and ``/metrics`` (the proxy's own,
``harness.route.own_metrics``).

Per request: its row of ``RouteInputs`` (``harness.route.inputs``), the
view (``ledger``, ``metrics`` or ``exact``) at the present, the router's choice (dead
backends masked: their utility set to -inf for the router; a router that
still picks one -- round-robin does not read utility -- is overruled by the
alive backend with the fewest residents in the view), one row per backend
in the decision log, then the request goes to the backend with ``model``
set to the backend's and the ``latroute`` field removed, and the answer
comes back unchanged. With ``--retry``, a request whose backend failed
before it produced a token is routed once more among the other alive
backends.
"""
from __future__ import annotations

import asyncio
import json
import math
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector, web

from estimators.snapshot import Query
from harness.route.backends import Backend
from harness.route.decisions import DecisionLog, RequestRow
from harness.route.forward import (
    MAX_BODY,
    MAX_HELD,
    BackendFailed,
    StreamRead,
    bounded_read,
    forwarded_headers,
    passed_back,
    whole_tokens,
)
from harness.route.inputs import InputPolicies, RequestBook, RequestFieldError, stated
from harness.route.ledger import Ledger
from harness.route.own_metrics import ProxyMetrics
from harness.serve.app import SSE_HEADERS, json_body, openai_application, prometheus_response
from harness.serve.clock import Clock
from harness.serve.protocol import ApiError, error_body, parse, request_id
from routers.base import SHED
from routers.fleet import DEFAULT_TIES
from routers.registry import make_router

DEAD_UTILITY = -1e30  # what a router is told a dead backend's utility is


def console(line: str) -> None:
    """A line for whoever watches the proxy's terminal: stderr, at once
    (stdout carries ``ready`` and the summary that scripts read)."""
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RouteConfig:
    backends: list[Backend]
    router: str
    port: int
    host: str = "127.0.0.1"
    view: str = "ledger"
    poll_interval_ms: float = 100.0
    retry: bool = False
    log: Path | None = None
    force: bool = False
    speed: float = 1.0
    policies: InputPolicies = field(default_factory=InputPolicies)
    capacity: int = 200_000
    epsilon: float = 0.1
    ties: str = DEFAULT_TIES  # two-level routers: a model's replica (routers.fleet; random: seeded by the policies' seed)
    overhead_s: float = 0.0
    request_timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    health_interval_s: float = 1.0
    log_estimates: bool = True
    pool_name: str = ""


class Proxy:
    def __init__(self, cfg: RouteConfig, clock: Clock, say=console):
        self.cfg, self.clock, self.say = cfg, clock, say
        b = cfg.backends
        self.book = RequestBook([x.model for x in b], np.array([x.spec.price_in for x in b]),
                                np.array([x.spec.price_out for x in b]), cfg.policies, cfg.capacity)
        self.router = make_router(cfg.router, self.book.inputs, [x.spec for x in b], cfg.overhead_s,
                                  seed=cfg.policies.seed, epsilon=cfg.epsilon, ties=cfg.ties)
        self.ledger = Ledger(b, clock, self.book.inputs.pred_total)
        self.log = DecisionLog(b, cfg.view)
        self.alive = [True] * len(b)
        self.metrics = ProxyMetrics([x.instance_id for x in b], self)
        self.views = self.ledger
        if cfg.view == "metrics":
            from harness.route.metrics_view import MetricsViews

            self.views = MetricsViews(b, self.ledger, clock, cfg.poll_interval_ms / 1e3 / cfg.speed, cfg.capacity,
                                      self.book.inputs, on_fail=self.mark_dead)
        elif cfg.view == "exact":
            from harness.route.exact_view import ExactViews

            self.views = ExactViews(b, clock, self.book.inputs, cfg.capacity, on_fail=self.mark_dead)
        self.session: ClientSession | None = None
        self.closing = False
        self.max_len = max(x.spec.config.max_model_len for x in b)
        self.model_names = list(dict.fromkeys(x.model for x in b))
        self.open: set[asyncio.Task] = set()  # the handlers of requests not yet answered whole

    # --- lifecycle
    async def start(self) -> None:
        self.session = ClientSession(connector=TCPConnector(limit=0, force_close=False),
                                     timeout=ClientTimeout(total=None, connect=self.cfg.connect_timeout_s,
                                                           sock_read=self.cfg.request_timeout_s))
        await self.views.start(self.session)

    async def stop(self) -> None:
        await self.views.stop()
        if self.session is not None:
            await self.session.close()

    def application(self) -> web.Application:
        return openai_application(self)

    # --- simple routes
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if any(self.alive) and not self.closing else 503)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": 0, "owned_by": "latroute-route", "root": m, "parent": None,
             "max_model_len": max(x.spec.config.max_model_len for x in self.cfg.backends if x.model == m)}
            for m in self.model_names]})

    async def metrics_text(self, request: web.Request) -> web.Response:
        return prometheus_response(self.metrics.text())

    # --- backends dying and coming back
    def mark_dead(self, j: int, reason: str) -> None:
        if not self.alive[j]:
            return
        self.alive[j] = False
        inst = self.cfg.backends[j].instance_id
        self.log.event(self.clock.now(), "dead", inst, reason)
        self.metrics.backend_up(j, False)
        # the log says it only when the proxy stops: whoever runs it should see a backend go now
        self.say(f"backend {inst} marked dead: {reason}")

    async def watch_health(self) -> None:
        """Every ``health_interval_s``, ask each dead backend's /health; a
        200 brings it back."""
        while not self.closing:
            await asyncio.sleep(self.cfg.health_interval_s)
            for j, b in enumerate(self.cfg.backends):
                if self.alive[j] or self.closing:
                    continue
                try:
                    async with self.session.get(b.url + "/health", timeout=ClientTimeout(total=2.0)) as r:
                        ok = r.status == 200
                except (ClientError, TimeoutError, OSError):
                    ok = False
                if ok:
                    self.alive[j] = True
                    self.log.event(self.clock.now(), "revived", b.instance_id, "GET /health answered 200")
                    self.metrics.backend_up(j, True)
                    self.say(f"backend {b.instance_id} alive again: GET /health answered 200")

    # --- the routing step
    def decide(self, i: int, attempt: int, excluded: set[int]) -> int:
        t = self.clock.now()
        views = self.views.views(t)
        usable = [self.alive[k] and k not in excluded for k in range(len(self.alive))]
        u = self.book.inputs.utility[i]
        told = u.copy()
        u[[k for k, ok in enumerate(usable) if not ok]] = DEAD_UTILITY
        r = self.router
        before = r.decision_ns
        try:
            j = r(i, t, views)
        finally:
            u[:] = told
        took_us = (r.decision_ns - before) / 1e3
        self.metrics.decided(took_us)
        if j == SHED and getattr(r, "sheds", False):
            chosen = SHED
        else:
            j = int(j)
            chosen = j if 0 <= j < len(usable) and usable[j] else self.fallback(views, usable)
        est = self.estimates(i, t, views) if self.cfg.log_estimates else None
        self.log.decision(i, attempt, t, [bool(x) for x in self.alive], [int(v.residents) for v in views],
                          self.views.ages(t), est, told, chosen, took_us)
        return chosen

    @staticmethod
    def fallback(views, usable: list[bool]) -> int:
        """The alive backend with the fewest residents (-1: none)."""
        best = [(int(v.residents), k) for k, v in enumerate(views) if usable[k]]
        return min(best)[1] if best else -1

    def estimates(self, i: int, t: float, views) -> np.ndarray | None:
        ests = getattr(self.router, "estimators", None)
        if not ests:
            return None
        q = Query(i, t, int(self.book.inputs.prompt[i]))
        out = np.full(len(views), np.nan)
        for k, (e, v) in enumerate(zip(ests, views)):
            try:
                x = float(e.estimate(v, q))
            except Exception:  # noqa: BLE001 - a plug-in's estimator: the log says nothing rather than fail
                continue
            out[k] = x if x >= 0 else np.nan
        return out

    # --- generation
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "/v1/completions", chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "/v1/chat/completions", chat=True)

    async def _generate(self, request: web.Request, path: str, chat: bool) -> web.StreamResponse:
        task = asyncio.current_task()
        self.open.add(task)
        try:
            return await self._route_one(request, path, chat)
        finally:
            self.open.discard(task)

    async def cut_open(self) -> None:
        """Cancel every request still open (shutdown, after the drain): each
        one's row says ``abandoned``."""
        tasks = list(self.open)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _checked(self, body: object, headers, chat: bool):
        """The body, what it states for routing, its parse; or ``ApiError``
        (run where ``json_body`` parses: a worker thread for a large body)."""
        if not isinstance(body, dict):
            raise ApiError("the request body must be a JSON object")
        try:
            said = stated(headers, body)
        except RequestFieldError as e:
            raise ApiError(str(e), e.param) from None
        return body, said, parse(body, chat, body.get("model"), self.max_len)

    async def _route_one(self, request: web.Request, path: str, chat: bool) -> web.StreamResponse:
        if self.closing:
            return web.json_response(error_body("the proxy is shutting down", 503), status=503)
        try:
            body, said, p = await json_body(request, lambda body: self._checked(body, request.headers, chat))
            client_id = request_id(request.headers.get("X-Request-Id")) or uuid.uuid4().hex
        except ApiError as e:
            return web.json_response(e.body(), status=e.status)
        if self.book.full:
            return web.json_response(error_body(f"the proxy's request capacity ({self.cfg.capacity}) is used up: "
                                                "restart it (route --capacity)", 503), status=503)
        t0 = self.clock.now()
        try:
            i = self.book.take(len(p.prompt_ids), p.max_tokens, said)
        except RequestFieldError as e:
            return web.json_response(error_body(str(e), 400, e.param), status=400)
        inp = self.book.inputs
        row = RequestRow(i, client_id, t0, len(p.prompt_ids), p.max_tokens,
                         float(inp.slo[i]) if math.isfinite(inp.slo[i]) else math.nan, int(inp.pred_total[i]),
                         p.stream)
        self.log.arrived(row)
        headers = forwarded_headers(request.headers)
        headers["X-Request-Id"] = client_id
        excluded: set[int] = set()
        failure: BackendFailed | None = None
        try:
            for attempt in range(2 if self.cfg.retry else 1):
                j = self.decide(i, attempt, excluded)
                if j == SHED:
                    row.status, row.error = "shed", "the router declined the request"
                    return web.json_response(error_body("the router declined the request (shed)", 503), status=503)
                if j < 0:
                    row.status, row.error = "error", "no backend alive"
                    return web.json_response(error_body("no backend is alive", 503), status=503)
                b = self.cfg.backends[j]
                row.instance_id, row.attempts = b.instance_id, attempt + 1
                data = json.dumps({**body, "model": b.model}).encode()
                self.ledger.dispatched(j, i, len(p.prompt_ids), p.max_tokens, self.clock.now())
                self.views.sent(j, i, len(p.prompt_ids), client_id)
                try:
                    if p.stream:
                        return await self._stream(request, b.url + path, data, headers, i, j, row, p.max_tokens)
                    return await self._whole(b.url + path, data, headers, i, j, row, p.max_tokens)
                except BackendFailed as e:  # nothing went out to the client: a retry is still possible
                    failure = e
                    self.ledger.ended(i, self.clock.now())
                    self.mark_dead(j, e.reason)
                    excluded.add(j)
                    row.error = f"{b.instance_id}: {e.reason}"
            row.status, row.finish_s = "error", self.clock.now()
            status = failure.status if failure is not None else 502
            return web.json_response(error_body(f"backend failed: {row.error}", status), status=status)
        except (asyncio.CancelledError, ClientGone) as e:  # the client went away: the backend request closes too
            if row.status == "open":
                row.status, row.error = "abandoned", "the client went away"
                row.finish_s = self.clock.now()
            if isinstance(e, ClientGone):  # as a cancelled handler: aiohttp closes the connection quietly
                raise asyncio.CancelledError from None
            raise
        finally:
            if self.ledger.ended(i, self.clock.now()) is not None and row.status == "open":
                row.status = "error"
            self.metrics.ended(row)
            if row.status == "ok":
                self.book.finished(row.output_tokens)

    async def _open(self, url: str, data: bytes, headers: dict):
        try:
            resp = await self.session.post(url, data=data, headers=headers)
        except (ClientError, TimeoutError, OSError) as e:
            raise BackendFailed(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
        if resp.status >= 500:
            try:
                text = (await bounded_read(resp, MAX_BODY))[:200].decode("utf-8", "replace")
            except BackendFailed as e:
                text = e.reason
            resp.release()
            raise BackendFailed(f"HTTP {resp.status}: {text}", resp.status)
        return resp

    async def _whole(self, url: str, data: bytes, headers: dict, i: int, j: int, row: RequestRow,
                     max_tokens: int) -> web.Response:
        resp = await self._open(url, data, headers)
        try:
            body = await bounded_read(resp, MAX_BODY)
        finally:
            resp.release()
        now = self.clock.now()
        if resp.status == 200:
            n = whole_tokens(body, max_tokens)
            self.ledger.streamed(i, n, now)
            row.first_s, row.finish_s, row.output_tokens, row.status = now, now, n, "ok"
        else:
            row.status, row.finish_s = "error", now
            row.error = f"HTTP {resp.status}: {body[:200].decode('utf-8', 'replace')}"
        return web.Response(status=resp.status, body=body, headers=passed_back(resp.headers))

    async def _stream(self, request: web.Request, url: str, data: bytes, headers: dict, i: int, j: int,
                      row: RequestRow, max_tokens: int) -> web.StreamResponse:
        resp = await self._open(url, data, headers)
        try:
            if resp.status != 200:  # a 4xx: the request's fault, passed back as it came
                body = await bounded_read(resp, MAX_BODY)
                row.status, row.finish_s = "error", self.clock.now()
                row.error = f"HTTP {resp.status}: {body[:200].decode('utf-8', 'replace')}"
                return web.Response(status=resp.status, body=body, headers=passed_back(resp.headers))
            read = StreamRead(max_tokens=max_tokens)
            out: web.StreamResponse | None = None
            held: list[bytes] = []  # chunks before the first token: held back, so a retry stays possible
            broken = None
            idle = 0  # bytes since the last token

            async def begin() -> web.StreamResponse:
                o = web.StreamResponse(status=200, headers={**SSE_HEADERS, **passed_back(resp.headers)})
                await o.prepare(request)
                for h in held:
                    await to_client(o, h)
                held.clear()
                return o

            try:
                async for chunk in resp.content.iter_chunked(1 << 16):
                    n = read.feed(chunk)
                    idle = 0 if n else idle + len(chunk)
                    if idle > MAX_HELD:
                        raise BackendFailed(f"{MAX_HELD} bytes of stream without a token")
                    if n:
                        now = self.clock.now()
                        self.ledger.streamed(i, n, now)
                        if row.output_tokens == 0:
                            row.first_s = now
                        row.output_tokens += n
                    if out is None:
                        if not n and read.error is None and not read.done:
                            held.append(chunk)
                            await asyncio.sleep(0)  # a backend that floods chunks does not hold the loop
                            continue
                        if read.backend_error and row.output_tokens == 0:
                            raise BackendFailed(f"error event before any token: {read.error}", 503)
                        out = await begin()
                    if read.done and read.error is None:  # complete: a client that leaves now abandons nothing
                        row.status, row.finish_s, row.output_tokens = "ok", self.clock.now(), read.tokens
                    await to_client(out, chunk)
                    if read.done:
                        break
            except (ClientError, TimeoutError, OSError) as e:
                broken = f"the stream broke off ({type(e).__name__})"
                if out is None:
                    raise BackendFailed(broken) from None
            except BackendFailed as e:
                if out is None:
                    raise
                broken = e.reason
            now = self.clock.now()
            if out is None:
                if not read.done:
                    raise BackendFailed("the stream ended without [DONE]")
                out = await begin()
            if broken or not read.done:
                reason = broken or "the stream ended without [DONE]"
                await to_client(out, b"data: " + json.dumps(error_body(f"backend failed: {reason}", 502)).encode()
                                + b"\n\ndata: [DONE]\n\n")
                row.status, row.finish_s, row.error = "error", now, reason
                self.mark_dead(j, reason)
            elif read.error is not None:
                row.status, row.finish_s, row.error = "error", now, read.error
                if read.backend_error:
                    self.mark_dead(j, read.error)
            elif row.status != "ok":
                row.status, row.finish_s, row.output_tokens = "ok", now, read.tokens
            await to_client(out, None)
            return out
        finally:
            resp.release()


class ClientGone(Exception):
    """A write to the client failed: it went away (not the backend's fault)."""


async def to_client(out: web.StreamResponse, data: bytes | None) -> None:
    """``data`` to the client (None: the end); ``ClientGone`` if it left."""
    try:
        if data is None:
            await out.write_eof()
        else:
            await out.write(data)
    except (ConnectionError, ClientError, RuntimeError) as e:  # RuntimeError: aiohttp's "closing transport"
        raise ClientGone(type(e).__name__) from None
