"""The ``ledger`` view: the proxy's own record per backend, and the engine
state reconstructed from it with the kernel.

The proxy knows what it sent where (prompt length, ``max_tokens``, the
predicted length it told the router), what has streamed back (tokens so
far, the first token's time) and which requests have ended. Between those
observations the engine's state is not observed, so it is reconstructed:
each backend has a shadow engine -- the twin's instance stepped in real
time by the scheduler kernel (``harness.serve.engine.ServedEngine``, the
engine ``latroute serve`` runs), without noise, on the backend's profile --
fed every request the proxy dispatches there. A shadow request runs to its
``max_tokens`` (a bound the client stated: never the truth) and leaves the
shadow when the proxy sees the real request end (its last chunk, an error
or the client going away), as an abort at the next step boundary. Routers
read each shadow through its ``HonestView`` (``harness.twin.views.honest``,
the same object the offline twin hands them): residents' targets are the
predicted lengths they were told, never ``max_tokens``.

Rows of the shadows' request tables are keyed by the proxy's request index
(the row of ``RouteInputs``), so ``pred_total[rid]`` means what it means in
the twin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness.route.backends import Backend
from harness.serve.clock import Clock
from harness.serve.engine import Served, ServedEngine
from harness.twin.instance import TwinConfig
from harness.twin.views.honest import HonestView


@dataclass
class Entry:
    """One dispatched request, as the proxy saw it."""

    backend: int
    prompt: int
    max_tokens: int
    sent_t: float
    handle: Served
    first_t: float = math.nan
    tokens: int = 0


class Ledger:
    """Per backend: the requests in flight and the shadow engine."""

    def __init__(self, backends: list[Backend], clock: Clock, predicted: np.ndarray):
        self.clock = clock
        self.shadows = [ServedEngine(k, b.spec, TwinConfig(noise=False, record_steps=False), clock)
                        for k, b in enumerate(backends)]
        for s in self.shadows:
            s.inst.predicted = predicted  # the views' targets: what routers were told (RouteInputs.pred_total)
        self.entries: dict[int, Entry] = {}
        self.early = 0  # shadow requests that ran to max_tokens before the real one ended (reconstruction behind)

    def _now(self, j: int, t: float) -> ServedEngine:
        s = self.shadows[j]
        s.catch_up(t)
        s.inst._now = t  # the shared "now" its view's arrival rate reads
        return s

    async def start(self, session) -> None:
        """Nothing to start: the ledger observes only the proxy's own traffic."""

    async def stop(self) -> None:
        """Nothing to stop."""

    def ages(self, t: float) -> list[float]:
        """How old the engine state in each view is: the ledger's is now."""
        return [0.0] * len(self.shadows)

    def sent(self, j: int, i: int, prompt: int, client_id: str = "") -> None:
        """The view needs nothing more: ``dispatched`` put the request in its shadow."""

    def views(self, t: float) -> list[HonestView]:
        """Every backend's honest view at ``t``."""
        return [self._now(j, t).inst.sync_view() for j in range(len(self.shadows))]

    def residents(self, j: int) -> int:
        return sum(1 for e in self.entries.values() if e.backend == j)

    def dispatched(self, j: int, i: int, prompt: int, max_tokens: int, t: float) -> None:
        s = self._now(j, t)
        h = s.submit(str(i), prompt, max(1, max_tokens), rid=i)
        self.entries[i] = Entry(j, prompt, max_tokens, t, h)

    def streamed(self, i: int, tokens: int, t: float) -> None:
        """``tokens`` more tokens of request ``i`` came back at ``t``."""
        e = self.entries.get(i)
        if e is None or tokens <= 0:
            return
        if e.tokens == 0:
            e.first_t = t
        e.tokens += tokens

    def ended(self, i: int, t: float) -> Entry | None:
        """Request ``i`` ended (finished, failed or abandoned): out of its
        shadow (an abort, applied at the next step boundary)."""
        e = self.entries.pop(i, None)
        if e is None:
            return None
        s = self._now(e.backend, t)
        h = e.handle
        if h.rid not in s.live and h.finish_reason == "length" and h.finish_t < t:
            self.early += 1
        s.abort(h)
        while not h.queue.empty():  # the shadow's token lists: nobody reads them
            h.queue.get_nowait()
        return e

    def drop_backend(self, j: int, t: float) -> list[int]:
        """A dead backend: its requests leave its shadow (they have failed);
        returns their indices."""
        gone = [i for i, e in self.entries.items() if e.backend == j]
        for i in gone:
            self.ended(i, t)
        return gone
