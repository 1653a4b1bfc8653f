"""``latroute route`` in front of a real vLLM 0.32 server (tiny-a, the
recording scheduler on, its state feed on ``LATROUTE_STATE_LISTEN``) and
an emulated one (``latroute serve``, tiny-b's profile). Skips cleanly
without ``LATROUTE_VLLM_PYTHON``.

One test, in order, because the last part kills the real server:
1. the real engine's state feed carries its scheduler's queues (three
   streams sent to it directly, read back from a frame);
2. ``--view exact`` reads that feed: shortest-queue sees the three streams
   the proxy did not send and routes around them;
3. the real server is killed (its whole process group, SIGKILL) while a
   stream through the proxy is running on it: that stream ends in an
   error event, the proxy drops the backend and says so in its log, later
   requests go to the live backend, and every request is in the log.
"""
from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from harness.live.ports import free_port_base
from tests.traces.vllm_recorder.test_recorder import TINY_A, VLLM_PYTHON, needs_vllm

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

from estimators.engine.layout import (  # noqa: E402
    F_BLOCKS,
    F_COMPUTED,
    F_OUTPUTS,
    F_PROMPT,
    F_STATUS,
    S_FREE_BLOCKS,
    S_NR,
    ST_RUNNING,
)
from harness.serve.state_feed import decode  # noqa: E402
from harness.studies.live_servers import VllmServer  # noqa: E402
from tests.harness.route.test_route_live import _read_log, _start, _stop, by_id  # noqa: E402
from tests.harness.serve.test_serve_http import events, open_stream, post  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
POOLS = ROOT / "docs" / "pools"
Q = {"latroute": {"quality": {"tiny-a": 0.5, "tiny-b": 0.8}}}  # the tiny models have no accuracy model


def _entry(name: str, **extra) -> dict:
    e = next(i for i in json.loads((POOLS / "tiny-ab.json").read_text())["instances"] if i["instance_id"] == name)
    return {**e, "profile": str(POOLS / f"{name}.profile.json"), **extra}


def _pool(path: Path, entries: list[dict]) -> Path:
    path.write_text(json.dumps({"name": path.stem, "frontend_overhead_s": 0.011, "instances": entries}))
    return path


def _frame(state_url: str, want, seconds: float = 30.0) -> tuple[dict, dict]:
    """The first frame of the feed for which ``want(head, arrays)`` holds."""
    deadline = time.monotonic() + seconds
    with urllib.request.urlopen(state_url + "/latroute/state", timeout=seconds) as r:
        while time.monotonic() < deadline:
            n = int.from_bytes(r.read(8), "little")
            head, a = decode(r.read(n))
            if want(head, a):
                return head, a
    raise AssertionError(f"no such frame in {seconds} s")


@needs_vllm
def test_real_vllm_state_feed_exact_view_and_killed_mid_run(tmp_path):
    base = free_port_base(4)
    real = VllmServer(VLLM_PYTHON, TINY_A.name, 1, base, tmp_path / "rec", tmp_path / "server.log",
                      state_port=base + 1)
    serve = None
    try:
        serve = _start(["serve", "--pool", str(_pool(tmp_path / "b.json", [_entry("tiny-b")])), "--port-base",
                        str(base + 2), "--noise", "off"], tmp_path)
        real.wait_healthy()
        pool = _pool(tmp_path / "ab.json", [_entry("tiny-a", url=real.url, state_url=real.state_url),
                                            _entry("tiny-b", url=f"http://127.0.0.1:{base + 2}")])
        port_a = base

        # 1. the feed: three streams straight to the real server, seen in its scheduler's state
        direct = [open_stream(port_a, {"model": "tiny-a", "prompt": [9] * 30, "max_tokens": 3000,
                                       "ignore_eos": True}, f"direct{k}") for k in range(3)]
        for _, resp in direct:
            assert events(resp, limit=1)
        head, a = _frame(real.state_url, lambda h, a: a["sc"][S_NR] == 3 and h["infl_n"] == 3)
        req = a["req"][: head["rows"]]
        assert sorted(head["ids"].values()) == ["direct0", "direct1", "direct2"]
        assert (req[:, F_PROMPT] == 30).all() and (req[:, F_STATUS] == ST_RUNNING).all()
        assert (req[:, F_OUTPUTS] >= 1).all() and (req[:, F_COMPUTED] >= 30).all()
        blocks = json.loads((tmp_path / "rec" / "engine.json").read_text())["num_kv_blocks"]
        assert (req[:, F_BLOCKS] >= 1).all()  # free = all but vLLM's null block and what the three hold
        assert a["sc"][S_FREE_BLOCKS] == blocks - 1 - req[:, F_BLOCKS].sum()
        assert head["infl_start"] is not None and list(a["tokens"]) == [1, 1, 1]  # a decode step in flight

        # 2. the exact view reads it: shortest-queue routes around the three streams it did not send
        log1 = tmp_path / "log-exact"
        p = _start(["route", "--pool", str(pool), "--router", "shortest-queue", "--view", "exact",
                    "--quality", "request", "--listen", f"127.0.0.1:{base + 3}", "--log", str(log1)], tmp_path)
        try:
            time.sleep(0.5)  # the feed connects
            st, body, _ = post(base + 3, "/v1/completions", {"prompt": "w5 w6", "max_tokens": 2, **Q},
                               {"X-Request-Id": "m1"})
            assert st == 200 and body["model"] == "tiny-b", body
        finally:
            for c, _ in direct:
                c.close()
            _stop(p)
        assert p.returncode == 0
        _, dec, _ = _read_log(log1)
        row = dec.set_index("instance_id")
        assert (dec["view"] == "exact").all() and row.loc["tiny-a", "residents"] == 3
        assert row.loc["tiny-b", "chosen"] and row.loc["tiny-b", "residents"] == 0

        # 3. the real server killed mid-run, a stream through the proxy on it
        log2 = tmp_path / "log-kill"
        p = _start(["route", "--pool", str(pool), "--router", "round-robin", "--retry",
                    "--quality", "request", "--listen", f"127.0.0.1:{base + 3}", "--log", str(log2)], tmp_path)
        try:
            conns = [open_stream(base + 3, {"prompt": [7] * 20, "max_tokens": 300, "ignore_eos": True, **Q}, f"long{k}")
                     for k in range(2)]
            firsts = [events(resp, limit=1) for _, resp in conns]
            on_real = [f[0]["model"] == "tiny-a" for f in firsts]
            assert sorted(on_real) == [False, True]  # round robin: one stream on each
            os.killpg(real.proc.pid, signal.SIGKILL)  # the API server and its engine core, at once
            real.proc.wait(30)
            ends = []
            for c, resp in conns:
                ends.append(events(resp))
                c.close()
            cut = [any(isinstance(x, dict) and "error" in x for x in e) for e in ends]
            assert cut == on_real and all(e[-1] == "[DONE]" for e in ends)
            for k in range(3):  # the real server is dead: everything goes to the emulated one
                st, body, _ = post(base + 3, "/v1/completions", {"prompt": "w5", "max_tokens": 2, **Q},
                                   {"X-Request-Id": f"after{k}"})
                assert st == 200 and body["model"] == "tiny-b"
            t0 = time.monotonic()
        finally:
            out, err = _stop(p)
        assert time.monotonic() - t0 < 10 and p.returncode == 0, err  # nothing hangs
        req, dec, meta = _read_log(log2)
        assert len(req) == 5  # nothing lost
        killed = [f"long{k}" for k in range(2) if on_real[k]][0]
        assert by_id(req, killed)["status"] == "error" and by_id(req, killed)["output_tokens"] >= 1
        assert (req.set_index("client_id").loc[[f"after{k}" for k in range(3)], "instance_id"] == "tiny-b").all()
        dead = {e["instance_id"] for e in meta["route"]["events"] if e["event"] == "dead"}
        assert dead == {"tiny-a"}
        assert not (dec["chosen"] & ~dec["alive"]).any()
    finally:
        if serve is not None:
            _stop(serve)
        real.stop()
