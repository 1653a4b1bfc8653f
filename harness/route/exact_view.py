"""The ``exact`` view: each backend's scheduler state as the backend itself
publishes it after every change (``harness.serve.state_feed``, served by
``latroute serve`` on ``/latroute/state``; a real vLLM's by the recording
scheduler, ``traces.vllm_recorder.state_feed``, at the pool's
``state_url``), and nothing else -- no ledger,
no reconstruction of the proxy's own. A request the proxy has sent but the
backend has not yet taken is not in it until the backend says so.

Each frame becomes a ``StaleView`` (the offline twin's published-view
type): the backend's request table with its rows renumbered to the
proxy's request indices (a row whose client id the proxy did not send is
the stand-in row, as in the ``metrics`` view) and the predicted lengths
routers were told as targets; times moved from the backend's clock to the
proxy's by the offset at receipt. Frames are decoded when a router asks,
from the latest one only.
"""
from __future__ import annotations

import asyncio

import numpy as np
from aiohttp import ClientError, ClientTimeout

from estimators.engine.layout import F_RID, F_TARGET, PL_N
from estimators.engine.state import SchedState, StepPlan
from harness.route.backend_tasks import BackendTasks
from harness.route.backends import Backend
from harness.serve.clock import Clock
from harness.serve.state_feed import decode
from harness.twin.stale_view import StaleView

RECONNECT_S = 1.0
STAND_IN_TOKENS = 128


class ExactViews(BackendTasks):
    def __init__(self, backends: list[Backend], clock: Clock, inputs, stand_in: int, on_fail=None):
        self.backends, self.clock, self.inputs, self.stand_in = backends, clock, inputs, stand_in
        if inputs.pred_total[stand_in] <= 1:
            inputs.pred_total[stand_in] = STAND_IN_TOKENS
        self.on_fail = on_fail or (lambda j, reason: None)
        t = clock.now()
        self.views_ = [self._empty(b, t) for b in backends]
        self.latest: list[tuple | None] = [None] * len(backends)
        self.received = [t] * len(backends)
        self.frames = [0] * len(backends)
        self.live = [False] * len(backends)  # the feed is connected: the published state is current
        self.index_of: dict[str, int] = {}

    @staticmethod
    def _empty(b: Backend, t: float) -> StaleView:
        st = SchedState.new(b.spec.config, capacity=8)
        return StaleView(t, b.instance_id, st, np.zeros(8, dtype=np.int64), 0, StepPlan.new(8), 0, None, 0.0, None)

    async def _read(self, j: int) -> None:
        url = self.backends[j].feed_url
        while True:
            try:
                async with self.session.get(url, timeout=ClientTimeout(total=None, sock_read=None)) as r:
                    if r.status != 200:
                        raise ClientError(f"HTTP {r.status}")
                    self.live[j] = True
                    while True:
                        n = int.from_bytes(await r.content.readexactly(8), "little")
                        payload = await r.content.readexactly(n)
                        self.latest[j] = (payload, self.clock.now())
                        self.frames[j] += 1
            except (ClientError, TimeoutError, OSError, asyncio.IncompleteReadError) as e:
                self.on_fail(j, f"state feed lost ({type(e).__name__})")
            self.live[j] = False
            await asyncio.sleep(RECONNECT_S)

    def _build(self, j: int, payload: bytes, at: float) -> StaleView:
        head, a = decode(payload)
        b = self.backends[j]
        cap, rows = head["cap"], head["rows"]
        st = SchedState.new(b.spec.config, capacity=cap)
        req = np.zeros((cap, head["width"]), dtype=np.int64)
        req[:rows] = a["req"]
        ids = head["ids"]
        for r in range(rows):
            cid = ids.get(str(int(req[r, F_RID])))
            k = self.index_of.get(cid, self.stand_in) if cid is not None else self.stand_in
            req[r, F_RID] = k
            req[r, F_TARGET] = self.inputs.pred_total[k]
        state = st._replace(req=req, sc=a["sc"].copy(), running=a["running"].copy(), waiting=a["waiting"].copy(),
                            free_slots=a["free_slots"].copy())
        n_in, n = head["n_inbox"], head["infl_n"]
        inbox = np.zeros(max(cap, 8), dtype=np.int64)
        inbox[:n_in] = a["inbox"]
        plan = StepPlan.new(cap)
        plan.slot[:n], plan.tokens[:n], plan.computed[:n] = a["slot"], a["tokens"], a["computed"]
        plan.counts[PL_N] = n
        offset = at - head["t"]
        start = None if head["infl_start"] is None else head["infl_start"] + offset
        wake = None if head["wake_s"] is None else head["wake_s"] + offset
        return StaleView(at, b.instance_id, state, inbox, n_in, plan, n, start, 0.0, wake)

    # --- what the proxy asks
    def views(self, t: float) -> list[StaleView]:
        for j, got in enumerate(self.latest):
            if got is not None:
                self.latest[j] = None
                self.views_[j] = self._build(j, *got)
                self.received[j] = got[1]
        return self.views_

    def ages(self, t: float) -> list[float]:
        """0 while a feed is connected (the backend publishes every change,
        so its last state is its state now), else since its last frame."""
        return [0.0 if up else max(t - r, 0.0) for up, r in zip(self.live, self.received)]

    def sent(self, j: int, i: int, prompt: int, client_id: str = "") -> None:
        """Only to know the request's rows when the backend publishes them."""
        self.index_of[client_id] = i
