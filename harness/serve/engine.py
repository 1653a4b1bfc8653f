"""One instance of the twin served in real time.

The twin's own ``Instance`` and kernel (``harness.twin.loop.kernel.advance``)
plan and time every step; this module only decides *when* to call them:
at each event the instance says is due (``Instance.due``: a step's end or
the end of the inter-step gap, i.e. the next ``schedule()``), once the wall
clock reaches it. Exact event skipping is off (``TwinConfig.skip``) so one
call is one event and every step's tokens can be handed out at its end;
skipping is exact, so the steps are the same.

Nothing about a request is known before it arrives: it enters the engine
(``Instance.add``) when its HTTP request does, with the output length the
engine itself would decide from the request: the emulated model never
emits EOS (it has no weights), so a request runs to ``max_tokens`` (or
max_model_len, vLLM's ``length``); ``min_tokens`` and ``ignore_eos`` are
accepted and change nothing. Output token ids are a seeded function of the
request and position, so a run is reproducible.

With prefix caching on, each request brings its prompt's block hash ids
(``harness.serve.prefix``, computed from its token ids by the HTTP side)
before it is added, so the kernel's block pool finds its hits as the
offline twin's does for a trace's ``hash_ids``.

Aborts (a client that went away) are applied at the next step boundary,
as vLLM's engine core applies them between steps (``harness.serve.abort``).
"""
from __future__ import annotations

import asyncio
import itertools
import math
import time
from array import array
from dataclasses import dataclass, field

import numpy as np

from estimators.engine.layout import F_OUTPUTS, F_PREEMPTIONS, F_RID, S_NPREEMPT, S_NR, S_WN
from harness.serve.abort import abort_slot, take_from_inbox
from harness.serve.clock import Clock
from harness.serve.prefix import GrowingHashes
from harness.twin.instance import Instance, InstanceSpec, TwinConfig, new_outcomes
from harness.twin.loop import parts as lp

VOCAB = 8192  # ../shared/models' word-level tokenizer: ids 0-2 are <unk>, <s>, </s>
HOLD_S = 1e-6  # twin seconds: how far past a step's end the next schedule() is held while aborts land
LATE_S = 0.005  # a step boundary handled later than this (wall) is counted as an overrun


def output_token(seed: int, rid: int, k: int) -> int:
    """The ``k``-th output token of request ``rid``: never a special id."""
    h = (seed * 0x9E3779B1 + rid * 0x85EBCA77 + k * 0xC2B2AE3D) & 0xFFFFFFFF
    h ^= h >> 15
    return 3 + h % (VOCAB - 3)


@dataclass
class Served:
    """One request on the engine, as the HTTP handler and the recording see it."""

    rid: int  # position in this instance's run (the kernel's request id)
    client_id: str  # X-Request-Id (or the server's own id)
    prompt: int
    max_tokens: int
    arrival_t: float  # twin seconds
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    slot: int = -1
    delivered: int = 0
    scheduled_t: float = math.nan
    first_t: float = math.nan
    last_t: float = math.nan
    finish_t: float = math.nan
    finish_reason: str | None = None
    preemptions: int = 0
    cached: int = 0
    engine_outputs: int = -1  # outputs the engine had produced when it dropped the request (aborts)
    gid: int = -1  # pool-wide request id, in arrival order (the recording's request_id)
    hash_ids: list[int] | None = None  # prompt block ids per the pool's hash block (None: no caching in the pool)

    def tokens(self, seed: int, start: int, stop: int) -> list[int]:
        return [output_token(seed, self.gid, k) for k in range(start, stop)]


class ServedEngine:
    """An instance of the pool stepped in real time (``run``), taking
    requests (``submit``) and aborts (``abort``) as they come."""

    def __init__(self, index: int, spec: InstanceSpec, cfg: TwinConfig, clock: Clock, metrics=None,
                 ids: itertools.count | None = None, hash_block: int | None = None):
        self.index, self.spec, self.clock, self.metrics = index, spec, clock, metrics
        self.ids = ids if ids is not None else itertools.count()
        self.cfg = cfg
        self.inst = Instance(index, spec, TwinConfig(seed=cfg.seed, noise=cfg.noise, record_steps=cfg.record_steps,
                                                     skip=False))
        self.out = new_outcomes(256)
        self.caching = bool(spec.config.caching)
        self.hash_block = hash_block or spec.config.block_size  # tokens per hash id submitted
        self.hashes = GrowingHashes() if self.caching else None
        if self.hashes is not None:
            self.inst.state = self.inst.state.with_hashes(self.hashes.value())
        self.requests: list[Served] = []  # every request, by rid
        self.live: dict[int, Served] = {}  # not finished, not aborted
        self.unstarted: dict[int, Served] = {}  # not yet scheduled once
        self.aborts: list[Served] = []  # waiting for the next step boundary
        self.lag = array("d")  # wall seconds each step end was delivered late
        self.overruns = 0  # step boundaries handled more than LATE_S late
        self.wake = asyncio.Event()
        self.stopping = False
        self.watchers: list[asyncio.Event] = []  # state feed readers (harness.serve.state_feed): set at each change

    # --- requests
    def submit(self, client_id: str, prompt: int, max_tokens: int, hash_ids: list[int] | None = None,
               rid: int | None = None) -> Served:
        """A request arrives now: bring the engine to now, then add it (an
        idle engine wakes: the gap, then schedule()). ``hash_ids``: its
        prompt's block ids, one per ``hash_block`` tokens (None: every
        block its own). ``rid``: the kernel's request id, when the caller
        numbers requests across engines (``latroute route``'s ledger, whose
        views are keyed by its own request index); default: this engine's
        next."""
        t = self.clock.now()
        self.catch_up(t)
        rid = len(self.requests) if rid is None else rid
        while rid >= self.out.first_t.size:
            self._grow_outcomes()
        h = Served(rid, client_id, prompt, max_tokens, t, gid=next(self.ids), hash_ids=hash_ids)
        self.requests.append(h)
        inst = self.inst
        if self.hashes is not None and self.hashes.add(rid, hash_ids, self.hash_block, prompt,
                                                       self.spec.config.block_size):
            inst.state = inst.state.with_hashes(self.hashes.value())
        inst.add(rid, prompt, max_tokens)
        h.slot = int(inst.tw.inbox[inst.meta[lp.M_INBOX_N] - 1])
        if inst.idle:
            inst.kick(t)
        self.live[rid] = h
        self.unstarted[rid] = h
        self.wake.set()
        if self.metrics is not None:
            self.metrics.arrived(h)
        self.changed()
        return h

    def changed(self) -> None:
        """The state changed: the feed's readers publish it."""
        for w in self.watchers:
            w.set()

    def abort(self, h: Served) -> None:
        """The client went away: no more tokens for it; the engine drops it
        at the next step boundary (now, if no step is in flight)."""
        if self.live.pop(h.rid, None) is None:
            return
        self.unstarted.pop(h.rid, None)
        h.finish_reason = "abort"
        h.finish_t = self.clock.now()
        self.aborts.append(h)
        if not self.inst.busy:
            self.catch_up(h.finish_t)
            self._apply_aborts()
        if self.metrics is not None:
            self.metrics.finished(h, self)
        self.changed()

    def _apply_aborts(self) -> None:
        inst = self.inst
        req = inst.state.req
        for h in self.aborts:
            if req[h.slot, F_RID] == h.rid:
                h.engine_outputs = int(req[h.slot, F_OUTPUTS])  # a discarded last step's token included
                take_from_inbox(inst.tw.inbox, inst.meta, lp.M_INBOX_N, h.slot)
            abort_slot(inst.state, h.slot, h.rid)
        self.aborts.clear()  # an engine left with nothing goes idle at its next schedule(), by the kernel

    def _grow_outcomes(self) -> None:
        old = self.out
        n = old.first_t.size
        new = new_outcomes(2 * n)
        for a, b in zip(new, old):
            a[:n] = b
        self.out = new

    # --- the clock
    async def run(self) -> None:
        """Handle every event when the wall clock reaches it, until ``stop``."""
        while not self.stopping:
            due = self.inst.due()
            if math.isinf(due):
                self.wake.clear()
                await self.wake.wait()
                continue
            delay = self.clock.wall(due) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
                continue
            self.catch_up(self.clock.now())
            await asyncio.sleep(0)  # let the handlers write what this step produced

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()

    def catch_up(self, t: float) -> None:
        """Handle, in order, every event due by twin time ``t``."""
        inst = self.inst
        while True:
            due = inst.due()
            if due > t or due == math.inf:
                return
            if inst.meta[lp.M_BUSY] == lp.RUNNING:
                self._complete(due)
            else:
                self._schedule(due)
            if self.watchers:
                self.changed()

    def _complete(self, t_end: float) -> None:
        inst = self.inst
        late = time.monotonic() - self.clock.wall(t_end)
        self.lag.append(late)
        if late > LATE_S:
            self.overruns += 1
        n = int(inst.meta[lp.M_N])
        slots = inst.plan.slot[:n].copy()
        scheduled = int(inst.plan.tokens[:n].sum())
        if self.aborts:
            self._complete_holding(t_end)
            self._apply_aborts()
        else:
            inst.advance(t_end, self.out)
            if inst.busy:  # a zero gap: the kernel planned the next step in the same call
                self._planned()
        req, out, seed = inst.state.req, self.out, self.cfg.seed
        produced = 0
        for s in slots:
            rid = int(req[s, F_RID])
            h = self.live.get(rid)
            if h is None:
                continue
            k = int(req[s, F_OUTPUTS])
            if k > h.delivered:
                produced += k - h.delivered
                if self.metrics is not None:
                    self.metrics.token(h, t_end)  # before the counts move: it reads the previous token's time
                if h.delivered == 0:
                    h.first_t = t_end
                done = bool(math.isfinite(out.finish_t[rid]))  # a request finishes only on a step that gave it a token
                h.queue.put_nowait(("tokens", h.tokens(seed, h.delivered, k), "length" if done else None))
                h.delivered = k
                h.last_t = t_end
            if math.isfinite(out.finish_t[rid]):
                h.finish_t = t_end
                h.finish_reason = "length"  # max_tokens or max_model_len: the emulated model never stops
                h.preemptions = int(req[s, F_PREEMPTIONS])
                del self.live[rid]
                if self.metrics is not None:
                    self.metrics.finished(h, self)
        if self.metrics is not None:
            self.metrics.step(scheduled, produced)

    def _complete_holding(self, t_end: float) -> None:
        """Complete the in-flight step but stop before the next schedule(),
        so that aborts land between the two as in vLLM's engine loop (with
        a zero inter-step gap the kernel would schedule at once): the
        kernel runs with its gap lengthened by HOLD_S, then the next
        schedule() is put back where the kernel's own gap puts it."""
        inst = self.inst
        model = inst.model
        inst.model = model._replace(gap=model.gap + HOLD_S)
        try:
            inst.advance(t_end, self.out)
        finally:
            inst.model = model
        if inst.meta[lp.M_BUSY] == lp.GAP:
            inst.times[lp.T_START] = t_end + model.gap

    def _schedule(self, t: float) -> None:
        inst = self.inst
        if self.aborts:
            self._apply_aborts()
        inst.advance(t, self.out)
        if inst.busy:
            self._planned()
        for rid in [r for r in self.unstarted if np.isfinite(self.out.reject_t[r])]:
            h = self.unstarted.pop(rid)
            self.live.pop(rid, None)
            h.finish_reason, h.finish_t = "rejected", t
            h.queue.put_nowait(("error", "the request needs more KV cache than the instance has", None))

    def _planned(self) -> None:
        """A step was just planned: its requests scheduled for the first
        time get their start and prefix-cache hit (and the counters)."""
        inst = self.inst
        start = float(inst.times[lp.T_START])
        req = inst.state.req
        for s in inst.plan.slot[: int(inst.meta[lp.M_N])]:
            h = self.unstarted.pop(int(req[s, F_RID]), None)
            if h is not None:
                h.scheduled_t = start
                h.cached = int(max(self.out.cached[h.rid], 0))
                if self.metrics is not None and self.caching:
                    self.metrics.admitted(h)
        if self.metrics is not None:
            self.metrics.preempted(int(inst.state.sc[S_NPREEMPT]))

    # --- what /metrics and the recording read
    @property
    def running(self) -> int:
        return int(self.inst.state.sc[S_NR])

    @property
    def waiting(self) -> int:
        return int(self.inst.state.sc[S_WN] + self.inst.meta[lp.M_INBOX_N])

    def kv_usage(self) -> float:
        return float(self.inst.kv_usage())

    def free_blocks(self) -> int:
        return int(self.inst.state.free_blocks)
