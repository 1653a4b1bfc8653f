"""A real vLLM's scheduler state, published the way ``latroute serve``
publishes its emulated engine's (standard library only).

``latroute route --view exact`` reads each backend's scheduler state from
a feed and nothing else (``harness.route.exact_view``). ``latroute serve``
serves that feed on its own port (``harness.serve.state_feed``); a real
vLLM server has no such endpoint, so the recording scheduler opens one in
the engine-core process when ``LATROUTE_STATE_LISTEN=127.0.0.1:PORT`` is
set: ``GET http://127.0.0.1:PORT/latroute/state`` streams a frame after
every change the scheduler makes (a request added or finished, a step
planned, a step's output applied). A pool entry's ``state_url`` points
the proxy at it.

A frame is byte for byte the format of ``harness.serve.state_feed``
(8-byte little-endian length; a 4-byte header length, a JSON header and
int64 arrays), so one reader serves both. The request table is built
from vLLM's own objects, one row per request the scheduler holds, in the
kernel's layout (``estimators.engine.layout``, restated below because
this package imports nothing of latroute's numeric stack):

- prompt, ``num_computed_tokens``, ``num_output_tokens``, the KV blocks
  it holds (``req_to_blocks``), its status (running, or waiting, which
  includes preempted), its preemptions and the blocks registered in the
  prefix cache (``num_cached_block``);
- never the output target (vLLM does not know where a request stops
  either: 0, the reader puts the router's prediction there) and never the
  in-flight step's end; the in-flight step's batch and start are there,
  as a scheduler knows them.

Rows are numbered per frame (running first, in vLLM's order, then the
waiting queue from its head); the header's ``ids`` maps each row to the
client's id (``X-Request-Id``), which is how the reader finds its own
requests. The prefix cache's block hashes are not published (nor does
``latroute serve`` publish them).

A slow reader gets the latest frame, not a backlog. Frames are built in
the scheduler's thread (vLLM's lists are consistent there) only while a
reader is connected; the cost is timed and written to ``recorder.json``.
"""
from __future__ import annotations

import json
import struct
import sys
import threading
import time
from array import array
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ENV_LISTEN = "LATROUTE_STATE_LISTEN"
PATH = "/latroute/state"

# estimators.engine.layout (stdlib restatement; tests/traces/vllm_recorder/test_recorder_state_feed.py checks they agree)
NF = 12
F_PROMPT, F_TARGET, F_COMPUTED, F_OUTPUTS, F_BLOCKS, F_STATUS, F_RID = 0, 1, 2, 3, 4, 5, 6
F_PREEMPTIONS, F_NCACHED = 8, 10
ST_WAITING, ST_RUNNING = 1, 2
NS = 8
S_NR, S_WHEAD, S_WN, S_FREE_BLOCKS, S_NFREE_SLOTS, S_CAP, S_STEP = 0, 1, 2, 3, 4, 6, 7
SLACK_ROWS = 8  # free rows beyond the residents, so a reader's kernel can admit without growing at once


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` on a loopback host (the feed exposes every request's shape)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        raise RuntimeError(f"{ENV_LISTEN}={text!r}: expected 127.0.0.1:PORT (loopback only)")
    return host.strip("[]"), int(port)


def frame(sched, step: int, inflight: tuple | None, id_of) -> bytes:
    """vLLM scheduler ``sched``'s state now as one frame. ``inflight`` is
    (perf_counter at schedule() entry, [(engine id, tokens, computed
    before, ...), ...]: the recorder's items) for a step planned and not
    yet applied, else None;
    ``id_of`` maps vLLM's engine id to the client's."""
    running = list(sched.running)
    run_ids = {r.request_id for r in running}
    waiting = [r for r in sched.waiting if r.request_id not in run_ids]
    reqs = running + waiting
    rows = len(reqs)
    cap = rows + SLACK_ROWS
    mgr = _single_type_manager(sched)
    held = getattr(mgr, "req_to_blocks", {}) if mgr is not None else {}
    ncached = getattr(mgr, "num_cached_block", {}) if mgr is not None else {}
    table = array("q", bytes(8 * rows * NF))
    row_of, ids = {}, {}
    for k, r in enumerate(reqs):
        rid = r.request_id
        row_of[rid] = k
        o = k * NF
        table[o + F_PROMPT] = int(r.num_prompt_tokens)
        table[o + F_COMPUTED] = int(r.num_computed_tokens)
        table[o + F_OUTPUTS] = int(r.num_output_tokens)
        blocks = held.get(rid)
        table[o + F_BLOCKS] = len(blocks) if blocks is not None else 0
        table[o + F_STATUS] = ST_RUNNING if k < len(running) else ST_WAITING
        table[o + F_RID] = k
        table[o + F_PREEMPTIONS] = int(getattr(r, "num_preemptions", 0))
        table[o + F_NCACHED] = int(ncached.get(rid, 0))
        ids[str(k)] = id_of(rid)
    sc = array("q", bytes(8 * NS))
    sc[S_NR], sc[S_WHEAD], sc[S_WN] = len(running), 0, len(waiting)
    sc[S_FREE_BLOCKS] = int(sched.kv_cache_manager.block_pool.get_num_free_blocks())
    sc[S_NFREE_SLOTS], sc[S_CAP], sc[S_STEP] = cap - rows, cap, step
    run_a = array("q", list(range(len(running))) + [0] * (cap - len(running)))
    wait_a = array("q", list(range(len(running), rows)) + [0] * (cap - len(waiting)))
    free_a = array("q", list(range(cap - 1, rows - 1, -1)) + [0] * rows)
    slot, tokens, computed = array("q"), array("q"), array("q")
    infl_start = None
    if inflight is not None:
        infl_start = inflight[0]
        for rid, n, before, *_ in inflight[1]:
            k = row_of.get(rid)
            if k is not None:
                slot.append(k)
                tokens.append(n)
                computed.append(before)
    if rows == 0:  # the reader expects at least one row (as serve sends): an empty one
        table = array("q", bytes(8 * NF))
    arrays = (table, sc, run_a, wait_a, free_a, array("q"), slot, tokens, computed)
    head = {"t": time.perf_counter(), "cap": cap, "width": NF, "rows": max(rows, 1), "n_inbox": 0,
            "infl_n": len(slot), "infl_start": infl_start, "wake_s": None, "ids": ids,
            "sizes": [len(a) for a in arrays]}
    hb = json.dumps(head, separators=(",", ":")).encode()
    body = b"".join(_le(a) for a in arrays)
    payload = struct.pack("<I", len(hb)) + hb + body
    return struct.pack("<Q", len(payload)) + payload


def _le(a: array) -> bytes:
    if sys.byteorder == "big":  # the wire is little-endian
        a = array("q", a)
        a.byteswap()
    return a.tobytes()


def _single_type_manager(sched):
    """The full-attention block manager of vLLM's KV cache (one group for these models)."""
    coord = getattr(sched.kv_cache_manager, "coordinator", None)
    managers = getattr(coord, "single_type_managers", None)
    return managers[0] if managers else None


class StateFeed:
    """The latest frame and the HTTP thread that streams it to readers."""

    def __init__(self, host: str, port: int):
        self.cond = threading.Condition()
        self.latest: bytes | None = None
        self.version = 0
        self.readers = 0
        self.frames = 0
        self.build_s = 0.0
        self.closed = False
        feed = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection does

            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path != PATH:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                feed._stream(self.wfile)

            def log_message(self, *args):  # quiet: vLLM's log is the server's log
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="latroute-state-feed", daemon=True)
        self.thread.start()

    @property
    def wanted(self) -> bool:
        return self.readers > 0

    def publish(self, build) -> None:
        """Build a frame with ``build()`` (in the caller's thread) if anyone reads."""
        if not self.readers:
            return
        t = time.perf_counter()
        data = build()
        self.build_s += time.perf_counter() - t
        with self.cond:
            self.latest, self.version = data, self.version + 1
            self.frames += 1
            self.cond.notify_all()

    def _stream(self, out) -> None:
        with self.cond:
            self.readers += 1
            seen = -1
        try:
            while True:
                with self.cond:
                    while (self.version == seen or self.latest is None) and not self.closed:
                        self.cond.wait(1.0)
                    if self.closed:
                        return
                    data, seen = self.latest, self.version
                out.write(data)
                out.flush()
        except OSError:  # the reader went away
            pass
        finally:
            with self.cond:
                self.readers -= 1

    def close(self) -> dict:
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()
        return {"frames": self.frames, "build_us_mean": 1e6 * self.build_s / self.frames if self.frames else None}
