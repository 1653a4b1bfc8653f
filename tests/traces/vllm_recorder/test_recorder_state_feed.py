"""The recording scheduler's state feed (``traces.vllm_recorder.state_feed``):
a real vLLM's scheduler state in ``latroute serve``'s frame format, so
``route --view exact`` reads either. The frame is checked here on vLLM's
own attribute names (a stand-in scheduler with them) and through the
reader's decoder and view builder; tests/harness/route/test_route_real.py checks it on
a real vLLM server."""
from __future__ import annotations

import http.client
import threading
import time
from types import SimpleNamespace

import numpy as np

import estimators.engine.layout as L
import traces.vllm_recorder.state_feed as feed_mod
from harness.live.ports import free_port_base
from harness.serve.state_feed import decode
from traces.vllm_recorder.state_feed import StateFeed, frame, parse_listen


def test_layout_restated_as_latroute_has_it():
    for name in ("NF", "F_PROMPT", "F_TARGET", "F_COMPUTED", "F_OUTPUTS", "F_BLOCKS", "F_STATUS", "F_RID",
                 "F_PREEMPTIONS", "F_NCACHED", "ST_WAITING", "ST_RUNNING", "NS", "S_NR", "S_WHEAD", "S_WN",
                 "S_FREE_BLOCKS", "S_NFREE_SLOTS", "S_CAP", "S_STEP"):
        assert getattr(feed_mod, name) == getattr(L, name), name


def _req(rid, prompt, computed, outputs, preemptions=0):
    return SimpleNamespace(request_id=rid, num_prompt_tokens=prompt, num_computed_tokens=computed,
                           num_output_tokens=outputs, num_preemptions=preemptions)


def _scheduler(running, waiting, blocks, free):
    mgr = SimpleNamespace(req_to_blocks={k: [0] * n for k, n in blocks.items()}, num_cached_block={})
    kv = SimpleNamespace(block_pool=SimpleNamespace(get_num_free_blocks=lambda: free),
                         coordinator=SimpleNamespace(single_type_managers=(mgr,)))
    return SimpleNamespace(running=running, waiting=waiting, kv_cache_manager=kv)


def _payload(data: bytes) -> bytes:
    assert int.from_bytes(data[:8], "little") == len(data) - 8
    return data[8:]


def test_frame_holds_vllms_queues_in_the_kernels_layout():
    run = [_req("cmpl-c1-0-abcdefgh", 300, 256, 0), _req("cmpl-c2-0-abcdefgh", 40, 45, 6)]
    wait = [_req("cmpl-c3-0-abcdefgh", 700, 128, 0, preemptions=1)]
    s = _scheduler(run, wait, {"cmpl-c1-0-abcdefgh": 3, "cmpl-c2-0-abcdefgh": 1}, free=95)
    infl = (12.5, [("cmpl-c1-0-abcdefgh", 44, 256), ("cmpl-c2-0-abcdefgh", 1, 45)])
    head, a = decode(_payload(frame(s, 7, infl, lambda rid: rid.split("-")[1])))
    req = a["req"]
    assert head["rows"] == 3 and head["cap"] >= 4 and head["infl_n"] == 2 and head["infl_start"] == 12.5
    assert head["ids"] == {"0": "c1", "1": "c2", "2": "c3"}
    assert list(req[:, L.F_PROMPT]) == [300, 40, 700] and list(req[:, L.F_COMPUTED]) == [256, 45, 128]
    assert list(req[:, L.F_OUTPUTS]) == [0, 6, 0] and list(req[:, L.F_BLOCKS]) == [3, 1, 0]
    assert list(req[:, L.F_STATUS]) == [L.ST_RUNNING, L.ST_RUNNING, L.ST_WAITING]
    assert list(req[:, L.F_PREEMPTIONS]) == [0, 0, 1] and not req[:, L.F_TARGET].any()  # never a target
    sc = a["sc"]
    assert (sc[L.S_NR], sc[L.S_WN], sc[L.S_WHEAD], sc[L.S_FREE_BLOCKS], sc[L.S_STEP]) == (2, 1, 0, 95, 7)
    cap = head["cap"]
    assert list(a["running"][:2]) == [0, 1] and a["waiting"][0] == 2 and a["running"].size == cap
    nfree = sc[L.S_NFREE_SLOTS]
    assert nfree == cap - 3 and sorted(a["free_slots"][:nfree]) == list(range(3, cap))
    assert list(a["slot"]) == [0, 1] and list(a["tokens"]) == [44, 1] and list(a["computed"]) == [256, 45]


def test_empty_engine_gives_one_free_row():
    head, a = decode(_payload(frame(_scheduler([], [], {}, 100), 0, None, str)))
    assert head["rows"] == 1 and head["ids"] == {} and head["infl_start"] is None
    assert a["sc"][L.S_NR] == 0 and a["sc"][L.S_NFREE_SLOTS] == head["cap"]


def test_feed_streams_the_latest_frame_and_builds_only_for_readers():
    port = free_port_base(1)
    f = StateFeed(*parse_listen(f"127.0.0.1:{port}"))
    built = []
    try:
        f.publish(lambda: built.append(1) or b"x")
        assert not built  # nobody reads: nothing built
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/latroute/state")
        r = c.getresponse()
        assert r.status == 200
        deadline = time.monotonic() + 10
        while not f.wanted:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        s = _scheduler([_req("r1", 10, 10, 1)], [], {"r1": 1}, 50)
        stop = threading.Event()

        def steps():  # the scheduler thread: a change, a frame, until the reader has one
            while not stop.is_set():
                f.publish(lambda: frame(s, 1, None, str))
                time.sleep(0.005)
        t = threading.Thread(target=steps, daemon=True)
        t.start()
        n = int.from_bytes(r.read(8), "little")
        head, a = decode(r.read(n))
        stop.set()
        t.join(5)
        assert head["ids"] == {"0": "r1"} and a["req"][0, L.F_PROMPT] == 10
        c.close()
    finally:
        summary = f.close()
    assert summary["frames"] >= 1 and summary["build_us_mean"] > 0


def test_listen_is_loopback_only():
    for bad in ("0.0.0.0:9000", "9000", "127.0.0.1:x"):
        try:
            parse_listen(bad)
        except RuntimeError as e:
            assert "LATROUTE_STATE_LISTEN" in str(e)
        else:
            raise AssertionError(bad)
    assert parse_listen("127.0.0.1:9000") == ("127.0.0.1", 9000)


def test_decoded_frame_becomes_the_exact_views_state():
    """The exact view's builder turns a recorder frame into a StaleView whose
    state holds the engine's queues (the rows renumbered to the proxy's requests)."""
    from estimators.engine.config import InstanceConfig
    from harness.route.backends import Backend
    from harness.route.exact_view import ExactViews
    from harness.serve.clock import Clock
    from harness.twin.instance import InstanceSpec

    run = [_req("cmpl-p1-0-abcdefgh", 300, 300, 2)]
    wait = [_req("cmpl-p2-0-abcdefgh", 200, 0, 0)]
    s = _scheduler(run, wait, {"cmpl-p1-0-abcdefgh": 3}, free=500)
    data = frame(s, 3, None, lambda rid: rid.split("-")[1])
    spec = InstanceSpec.from_config(InstanceConfig(instance_id="x", model="qwen3-0.6b", profile="qwen3-0.6b-h100",
                                                   num_kv_blocks=504))
    inputs = SimpleNamespace(pred_total=np.array([0, 40, 90, 0], dtype=np.int64))
    ev = ExactViews([Backend("http://127.0.0.1:1", spec, "http://127.0.0.1:2")], Clock(), inputs, stand_in=3)
    ev.index_of.update({"p1": 1, "p2": 2})
    v = ev._build(0, _payload(data), 5.0)
    req = v.state.req
    assert list(req[:2, L.F_RID]) == [1, 2] and list(req[:2, L.F_TARGET]) == [40, 90]
    assert v.state.sc[L.S_NR] == 1 and v.state.sc[L.S_WN] == 1 and v.state.sc[L.S_FREE_BLOCKS] == 500
    assert ev.backends[0].feed_url == "http://127.0.0.1:2/latroute/state"
