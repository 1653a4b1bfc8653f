"""The state feed: an emulated instance's scheduler state, published after
every change (a step planned or ended, a request added or aborted) on
``GET /latroute/state``, for routers that read the engine exactly
(``latroute route --view exact``, ``harness.route.exact_view``).

What is published is what vLLM's scheduler itself holds and a router could
be given by it: the request table (prompt, computed tokens, outputs so
far, status, slot), the running and waiting queues, the counters and free
blocks, the inbox, the in-flight step's batch and start; each live
request's client id (``X-Request-Id``), so the reader can tell its own
requests. Never a request's output target (zeroed: the emulated engine
runs to ``max_tokens``, which a real engine does not know to stop at), nor
the in-flight step's end.

Frames on the wire: an 8-byte little-endian length, then the payload: a
4-byte header length, the JSON header, and the int64 arrays the header
lists, in order. A slow reader gets the latest state, not a backlog.
"""
from __future__ import annotations

import json
import struct

import numpy as np

from estimators.engine.layout import F_RID, F_TARGET

ARRAYS = ("req", "sc", "running", "waiting", "free_slots", "inbox", "slot", "tokens", "computed")


def encode(engine) -> bytes:
    """The current state of ``engine`` (a ``harness.serve.engine.ServedEngine``) as one frame."""
    inst = engine.inst
    st = inst.state
    rows = max(int(inst.rows_used), 1)
    req = st.req[:rows].copy()
    req[:, F_TARGET] = 0
    n_in, n = inst.n_inbox, inst.infl_n
    ids = {}
    for r in req[:, F_RID]:
        h = engine.live.get(int(r))
        if h is not None:
            ids[int(r)] = h.client_id
    arrays = (req, st.sc, st.running, st.waiting, st.free_slots, inst.inbox[:n_in], inst.plan.slot[:n],
              inst.plan.tokens[:n], inst.plan.computed[:n])
    head = {"t": engine.clock.now(), "cap": int(st.capacity), "width": int(st.req.shape[1]), "rows": rows,
            "n_inbox": n_in, "infl_n": n, "infl_start": inst.infl_start, "wake_s": inst.wake_s,
            "ids": ids, "sizes": [int(a.size) for a in arrays]}
    hb = json.dumps(head, separators=(",", ":")).encode()
    body = b"".join(np.ascontiguousarray(a, dtype=np.int64).tobytes() for a in arrays)
    payload = struct.pack("<I", len(hb)) + hb + body
    return struct.pack("<Q", len(payload)) + payload


def decode(payload: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """A frame's payload (without its length): the header and the arrays."""
    (hl,) = struct.unpack_from("<I", payload)
    head = json.loads(payload[4:4 + hl])
    flat = np.frombuffer(payload, dtype=np.int64, offset=4 + hl)
    out, k = {}, 0
    for name, size in zip(ARRAYS, head["sizes"]):
        out[name] = flat[k:k + size]
        k += size
    out["req"] = out["req"].reshape(head["rows"], head["width"])
    return head, out
