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

A feed is untrusted input: a frame longer than ``MAX_FRAME`` ends the
connection, and a frame is checked before it becomes a view (its header a
JSON object, sizes that add up to the payload, a request table of at most
``MAX_ROWS`` rows of the engine's width, every slot index within it,
finite times); a frame that breaks a bound fails the backend as a lost
feed does (marked dead, the reason logged), and the previous view stays.
A feed is reported current (age 0) only while a whole frame has come in
within ``request_timeout`` of a frame started.
"""
from __future__ import annotations

import asyncio
import math
import struct

import numpy as np
from aiohttp import ClientError, ClientTimeout

from estimators.engine.layout import F_RID, F_TARGET, NS, PL_N, S_CAP, S_NFREE_SLOTS, S_NR, S_WHEAD, S_WN
from estimators.engine.state import SchedState, StepPlan
from harness.route.backend_tasks import BackendTasks
from harness.route.backends import Backend
from harness.serve.clock import Clock
from harness.serve.protocol import loads_bounded
from harness.serve.state_feed import decode
from harness.twin.views.stale import StaleView
from traces.datamodel.limits import MAX_TIME_S

RECONNECT_S = 1.0
STAND_IN_TOKENS = 128
MAX_ROWS = 1 << 16  # a request table's rows (slots): far above any engine's concurrent requests
MAX_FRAME = 64 << 20  # bytes: MAX_ROWS rows of the request table and the queues fit with room
FRAME_S = 10.0  # wall seconds a started frame may take to arrive whole


class BadFrame(ValueError):
    """A state frame the proxy refuses."""


def _int(head: dict, key: str, lo: int, hi: int) -> int:
    v = head.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise BadFrame(f"{key} {str(v)[:40]} is not an integer in [{lo}, {hi}]")
    return v


def _time(head: dict, key: str, optional: bool) -> float | None:
    v = head.get(key)
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and abs(v) <= MAX_TIME_S):
        raise BadFrame(f"{key} {str(v)[:40]} is not a time in [-{MAX_TIME_S:g}, {MAX_TIME_S:g}]")
    return float(v)


def checked_frame(payload: bytes, width: int) -> tuple[dict, dict[str, np.ndarray]]:
    """``decode`` with every bound checked (``BadFrame``)."""
    if len(payload) < 4:
        raise BadFrame("a frame shorter than its header length")
    (hl,) = struct.unpack_from("<I", payload)
    if 4 + hl > len(payload):
        raise BadFrame(f"a header of {hl} bytes in a frame of {len(payload)}")
    try:
        head = loads_bounded(payload[4:4 + hl], 4)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadFrame(f"the header is not JSON ({str(e)[:80]})") from None
    if not isinstance(head, dict):
        raise BadFrame("the header is not a JSON object")
    cap = _int(head, "cap", 1, MAX_ROWS)
    rows = _int(head, "rows", 0, cap)
    if _int(head, "width", 1, 64) != width:
        raise BadFrame(f"a request table {head['width']} wide, not the engine's {width}")
    n_in, n = _int(head, "n_inbox", 0, cap), _int(head, "infl_n", 0, cap)
    for key, optional in (("t", False), ("infl_start", True), ("wake_s", True)):
        _time(head, key, optional)
    sizes = head.get("sizes")
    want = [rows * width, NS, cap, cap, cap, n_in, n, n, n]
    if sizes != want:
        raise BadFrame(f"array sizes {str(sizes)[:80]} do not match the header's rows and capacity")
    if len(payload) - 4 - hl != 8 * sum(want):
        raise BadFrame(f"{len(payload) - 4 - hl} bytes of arrays, not the {8 * sum(want)} the header says")
    ids = head.get("ids")
    if not isinstance(ids, dict) or not all(isinstance(v, str) for v in ids.values()):
        raise BadFrame("ids is not an object of client ids")
    head, a = decode(payload)
    sc = a["sc"]
    if sc[S_CAP] != cap or not (0 <= sc[S_NR] <= cap and 0 <= sc[S_WN] <= cap and 0 <= sc[S_WHEAD] < cap
                                and 0 <= sc[S_NFREE_SLOTS] <= cap):
        raise BadFrame("the scheduler counters do not fit the request table")
    for name in ("running", "waiting", "free_slots", "inbox", "slot"):
        x = a[name]
        if x.size and (x.min() < 0 or x.max() >= cap):
            raise BadFrame(f"{name} holds a slot outside the request table")
    return head, a


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
                        if not 4 <= n <= MAX_FRAME:
                            raise BadFrame(f"a frame of {n} bytes, not in [4, {MAX_FRAME}]")
                        self.live[j] = False  # until the frame is in whole: the view is not current
                        async with asyncio.timeout(FRAME_S):  # not wait_for: 3.11's can swallow a cancel
                            payload = await r.content.readexactly(n)
                        self.live[j] = True
                        self.latest[j] = (payload, self.clock.now())
                        self.frames[j] += 1
            except BadFrame as e:
                self.on_fail(j, f"state feed refused: {e}")
            except (ClientError, TimeoutError, OSError, asyncio.IncompleteReadError) as e:
                self.on_fail(j, f"state feed lost ({type(e).__name__})")
            self.live[j] = False
            await asyncio.sleep(RECONNECT_S)

    def _build(self, j: int, payload: bytes, at: float) -> StaleView:
        b = self.backends[j]
        head, a = checked_frame(payload, self.views_[j].state.req.shape[1])
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
                try:
                    self.views_[j] = self._build(j, *got)
                except BadFrame as e:  # the backend is failed; the router keeps its last good view
                    self.on_fail(j, f"state feed refused: {e}")
                    continue
                self.received[j] = got[1]
        return self.views_

    def ages(self, t: float) -> list[float]:
        """0 while a feed is connected (the backend publishes every change,
        so its last state is its state now), else since its last frame."""
        return [0.0 if up else max(t - r, 0.0) for up, r in zip(self.live, self.received)]

    def sent(self, j: int, i: int, prompt: int, client_id: str = "") -> None:
        """Only to know the request's rows when the backend publishes them."""
        self.index_of[client_id] = i
