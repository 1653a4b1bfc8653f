"""``latroute route``'s parts without a network: what a request says about
itself, the SSE reader, pool urls, the ledger's shadow and the command
line's refusals (exit 2, one line, before anything binds)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from harness.route.forward import BackendFailed, StreamRead, forwarded_headers, whole_tokens
from harness.route.inputs import InputPolicies, RequestBook, RequestFieldError, check_lengths_policy, stated
from tests.conftest import assert_refused, run_cli
from traces.errors import BadInput
from traces.policies.slo import slo_targets

MODELS = ["qwen3-0.6b", "qwen3-8b", "qwen3-32b"]


def test_stated_reads_headers_over_fields_and_strips_the_field():
    body = {"prompt": "w1", "latroute": {"slo_ttft_ms": 400, "quality": {"qwen3-8b": 0.5}, "predicted_tokens": 9}}
    s = stated({"x-llm-d-slo-ttft-ms": "250", "x-latroute-quality": "qwen3-0.6b=0.25"}, body)
    assert "latroute" not in body  # never forwarded to a backend
    assert s.slo_s == pytest.approx(0.25) and s.predicted == 9
    assert s.quality == {"qwen3-8b": 0.5, "qwen3-0.6b": 0.25}
    assert stated({}, {"latroute": {"slo_ttft_ms": 400}}).slo_s == pytest.approx(0.4)
    for headers, body, param in [({"x-llm-d-slo-ttft-ms": "soon"}, {}, "x-llm-d-slo-ttft-ms"),
                                 ({"x-latroute-quality": "qwen3-8b=1.5"}, {}, "x-latroute-quality"),
                                 ({"x-latroute-quality": "nonsense"}, {}, "x-latroute-quality"),
                                 ({}, {"latroute": 3}, "latroute"),
                                 ({"x-latroute-predicted-tokens": "0"}, {}, "x-latroute-predicted-tokens")]:
        with pytest.raises(RequestFieldError) as e:
            stated(headers, body)
        assert e.value.param == param


def test_book_fills_route_inputs_with_replays_policies():
    prompts = np.array([100, 2000, 40, 900])
    book = RequestBook(MODELS, np.array([0.044, 0.072, 0.287]), np.array([0.173, 0.287, 0.64]),
                       InputPolicies(seed=7), capacity=8)
    for p in prompts:
        book.take(int(p), 50, stated({}, {}))
    # the SLO rule's draws are replay's, request by request
    want = slo_targets(pd.DataFrame({"prompt_tokens": prompts}), "rule", 7).seconds
    assert np.allclose(book.inputs.slo[:4], want)
    assert (book.inputs.pred_total[:4] == 50).all()  # --lengths max-tokens
    acc = book.acc_hat[:4]
    cost = prompts[:, None] * book.price_in[None] + 50 * book.price_out[None]
    assert np.allclose(book.inputs.utility[:4], acc - 5e-4 * cost) and ((acc >= 0) & (acc <= 1)).all()
    i = book.take(10, 50, stated({"x-latroute-quality": ",".join(f"{m}=0.5" for m in MODELS),
                                  "x-latroute-slo-ttft-ms": "100", "x-latroute-predicted-tokens": "7"}, {}))
    assert book.inputs.slo[i] == pytest.approx(0.1) and book.inputs.pred_total[i] == 7
    assert np.allclose(book.acc_hat[i], 0.5)
    med = RequestBook(MODELS, np.zeros(3), np.zeros(3), InputPolicies(lengths="median", slo="none"), 4)
    med.take(10, 80, stated({}, {}))
    for n in (10, 20, 40):
        med.finished(n)
    j = med.take(10, 80, stated({}, {}))
    assert med.inputs.pred_total[:2].tolist() == [80, 20] and math.isinf(med.inputs.slo[j])
    strict = RequestBook(MODELS, np.zeros(3), np.zeros(3), InputPolicies(quality="request"), 2)
    with pytest.raises(RequestFieldError, match="no accuracy for model qwen3-0.6b"):
        strict.take(10, 5, stated({}, {}))
    for bad in ("median:3", "constant:0", "oracle"):
        with pytest.raises(ValueError):
            check_lengths_policy(bad)


def test_stream_read_counts_tokens_errors_and_the_end_across_chunk_cuts():
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant"}}]},
              {"choices": [{"index": 0, "delta": {"content": " w5"}}]},
              {"choices": [{"index": 0, "text": " w6"}]},
              {"choices": [], "usage": {"completion_tokens": 2}}]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"
    r = StreamRead()
    got = [r.feed(raw[k:k + 7]) for k in range(0, len(raw), 7)]  # cut anywhere
    assert sum(got) == 2 and r.done and r.tokens == 2 and r.error is None
    e = StreamRead()
    e.feed(b'data: {"error": {"message": "the server is shutting down", "code": 503}}\n\ndata: [DONE]\n\n')
    assert e.backend_error and e.done and e.error == "the server is shutting down"
    q = StreamRead()
    q.feed(b'data: {"error": {"message": "too long", "code": 400}}\n\n')
    assert q.error and not q.backend_error  # the request's fault: passed back, the backend stays alive
    assert whole_tokens(b'{"usage": {"completion_tokens": 5}}', 8) == 5 and whole_tokens(b"{}", 8) == 0
    for broken in (b"<html>", b'{"usage": {"completion_tokens": 9}}', b'{"usage": {"completion_tokens": -5}}',
                   b'{"usage": {"completion_tokens": 1e300}}', b'{"usage": {"completion_tokens": Infinity}}'):
        with pytest.raises(BackendFailed):  # a count no request of max_tokens 8 has: the backend is broken
            whole_tokens(broken, 8)
    assert forwarded_headers({"Host": "x", "X-Latroute-Quality": "a=1", "X-Request-Id": "r"}) == {"X-Request-Id": "r"}


def test_pool_entries_take_a_url(tmp_path):
    from harness.twin.pools.spec import load_pool

    entry = {"instance_id": "a", "model": "qwen3-8b", "profile": "qwen3-8b-h100"}
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"instances": [{**entry, "url": "http://127.0.0.1:8100/"}, {**entry, "instance_id": "b"}]}))
    assert load_pool(p).urls == ("http://127.0.0.1:8100", None)
    p.write_text(json.dumps({"instances": [entry]}))
    assert load_pool(p).urls == ()  # pools without urls are unchanged
    for bad, why in [({**entry, "url": "ftp://x"}, "must be an http"), ({**entry, "url": 5}, "must be an http"),
                     ({**entry, "url": "http://h:1", "replicas": 2}, "replicas")]:
        p.write_text(json.dumps({"instances": [bad]}))
        with pytest.raises(BadInput, match=why):
            load_pool(p)


def test_ledger_shadow_keys_rows_by_request_and_forgets_ended_ones():
    from harness.route.backends import pool_backends
    from harness.route.ledger import Ledger
    from harness.serve.clock import Clock
    from harness.twin.pools.spec import load_pool

    bk = pool_backends(load_pool("qwen3-h100"), ("http://x:1", "http://x:2", "http://x:3"))
    pred = np.full(16, 5, dtype=np.int64)
    fast = Clock(speed=1e9)  # a hand-over first, as ``route`` warms up before its clock starts: nothing compiles below
    Ledger(bk, fast, pred).dispatched(1, 0, 8, 2, fast.now())
    clock = Clock(speed=1.0)  # real time: both requests (40 tokens each) are still running when looked at
    led = Ledger(bk, clock, pred)
    t = clock.now()
    led.dispatched(1, 7, 300, 40, t)
    led.dispatched(1, 9, 100, 40, t)
    v = led.views(t)
    assert [x.residents for x in v] == [0, 2, 0] and led.residents(1) == 2
    rid, prompt, _, _ = v[1].resident_progress()
    assert sorted(rid.tolist()) == [7, 9]  # rows keyed by the proxy's request index, as in the twin
    targets = v[1].state.req[np.isin(v[1].state.req[:, 0], [7, 9])]
    assert 40 not in targets  # the view shows the predicted length (5), never max_tokens
    led.streamed(7, 3, t)
    assert led.entries[7].tokens == 3 and not math.isnan(led.entries[7].first_t)
    led.ended(7, clock.now())
    led.ended(9, clock.now())
    assert led.views(clock.now() + 1.0)[1].residents == 0 and led.residents(1) == 0


@pytest.mark.parametrize("args, says", [
    (["--pool", "qwen3-h100", "--router", "sfs-cc", "--listen", "127.0.0.1:1"], "--pool: instance qwen3-0.6b has no url"),
    (["--pool", "qwen3-h100", "--backends", "http://127.0.0.1:1", "--router", "sfs-cc", "--listen", "127.0.0.1:2"],
     "1 URLs for pool qwen3-h100's 3 instances"),
    (["--backends", "http://127.0.0.1:1", "--router", "sfs-cc", "--listen", "127.0.0.1:2"], "need --profile"),
    (["--backends", "http://127.0.0.1:1", "--router", "oracle", "--listen", "127.0.0.1:2"], "oracle"),
    (["--backends", "http://127.0.0.1:1", "--router", "lps-hard", "--listen", "127.0.0.1:2"], "baseline parameters"),
    (["--backends", "http://127.0.0.1:1", "--router", "sfs-cc", "--listen", "nohost"], "not HOST:PORT"),
    (["--backends", "http://127.0.0.1:1", "--router", "sfs-cc", "--listen", "127.0.0.1:2", "--lengths", "x"],
     "--lengths"),
])
def test_route_refuses_bad_options_before_binding(args, says):
    pytest.importorskip("prometheus_client", reason="latroute route needs the serve extra, refused before its options")
    r = run_cli("route", *args)
    assert_refused(r, None, says)
    assert r.stdout == ""


def test_state_feed_round_trip_is_the_engines_view_without_its_targets():
    """A served engine's published frame, read back by the exact view, shows
    the residents and progress the engine's own honest view shows, keyed by
    the proxy's request indices, with the predicted lengths as targets."""
    from estimators.engine.layout import F_RID, F_TARGET
    from harness.route.backends import pool_backends
    from harness.route.exact_view import ExactViews
    from harness.serve.clock import Clock
    from harness.serve.engine import ServedEngine
    from harness.serve.state_feed import encode
    from harness.twin.instance import TwinConfig
    from harness.twin.pools.spec import load_pool
    from routers.base import RouteInputs

    bk = pool_backends(load_pool("qwen3-h100"), ("http://x:1", "http://x:2", "http://x:3"))
    clock = Clock(speed=1.0)
    eng = ServedEngine(0, bk[1].spec, TwinConfig(noise=False, record_steps=False), clock)
    for k, p in enumerate((900, 40, 3000, 70)):
        eng.submit(f"c{k}", p, 500)
    eng.catch_up(clock.now() + 0.2)  # a few steps: some running, some decoding
    inputs = RouteInputs(np.zeros(11, dtype=np.int64), np.ones(11), np.zeros((11, 3)), np.full(11, 33))
    ex = ExactViews(bk, clock, inputs, stand_in=10)
    for k, idx in enumerate((4, 5, 6)):  # c3 did not come through the proxy: the stand-in row
        ex.sent(1, idx, 0, f"c{k}")
    frame = encode(eng)
    v = ex._build(1, frame[8:], clock.now())
    own = eng.inst.sync_view()
    assert v.residents == own.residents == 4 and v.n_inbox == own.n_inbox and v.infl_n == own.infl_n
    rid, prompt, computed, outputs = v.resident_progress()
    orid, oprompt, ocomputed, ooutputs = own.resident_progress()
    back = {4: 0, 5: 1, 6: 2, 10: 3}
    assert [back[int(r)] for r in rid] == orid.tolist()
    assert prompt.tolist() == oprompt.tolist() and computed.tolist() == ocomputed.tolist()
    assert outputs.tolist() == ooutputs.tolist()
    live = v.state.req[np.isin(v.state.req[:, F_RID], [4, 5, 6, 10])]
    assert (live[:, F_TARGET] == 33).all()  # the told lengths; the engine's 500 is never published
    from harness.serve.state_feed import decode

    _, arrays = decode(frame[8:])
    assert (arrays["req"][:, F_TARGET] == 0).all() and (eng.inst.state.req[:4, F_TARGET] == 500).all()


def test_a_plug_in_routes_and_a_dead_backend_is_never_chosen():
    """A module:Class plug-in decides on the proxy's views; when it picks a
    dead backend the proxy overrules it with the alive backend with the
    fewest residents, and the log says which was alive and chosen."""
    pytest.importorskip("prometheus_client", reason="the proxy's /metrics needs the serve extra")
    from harness.route.backends import pool_backends
    from harness.route.proxy import Proxy, RouteConfig
    from harness.serve.clock import Clock
    from harness.twin.pools.spec import load_pool

    bk = pool_backends(load_pool("qwen3-h100"), ("http://x:1", "http://x:2", "http://x:3"))
    p = Proxy(RouteConfig(backends=bk, router="tests.plugin_router:LastInstance", port=1), Clock())
    said = stated({}, {})
    i = p.book.take(100, 10, said)
    assert p.decide(i, 0, set()) == 2  # the plug-in's answer: the last instance
    p.ledger.dispatched(0, i, 100, 10, p.clock.now())
    p.mark_dead(2, "test")
    j = p.book.take(100, 10, said)
    assert p.decide(j, 0, set()) == 1  # overruled: 0 has a resident, 1 has none
    assert p.decide(p.book.take(100, 10, said), 0, {1}) == 0  # excluded (a retry): the only one left
    assert p.log.events == [{"t_s": p.log.events[0]["t_s"], "event": "dead", "instance_id": "qwen3-32b",
                             "reason": "test"}]
    dec = p.log.decisions_frame()
    assert dec.groupby("request_id")["chosen"].sum().eq(1).all() and not (dec["chosen"] & ~dec["alive"]).any()
    assert (p.book.inputs.utility[j] > -1.0).all()  # the dead mask (-1e30) was the router's only, not the log's


@pytest.mark.parametrize("ties", ["lowest-index", "least-latency", "random"])
def test_the_proxy_takes_the_tie_policy(ties: str):
    """``latroute route --ties`` reaches the two-level router the proxy
    builds (replica pools: its choice among a model's replicas)."""
    pytest.importorskip("prometheus_client", reason="the proxy's /metrics needs the serve extra")
    from harness.route.backends import pool_backends
    from harness.route.proxy import Proxy, RouteConfig
    from harness.serve.clock import Clock
    from harness.twin.pools.spec import load_pool

    pool = load_pool("qwen3-h100-x8")
    bk = pool_backends(pool, tuple(f"http://x:{k + 1}" for k in range(len(pool.instances))))
    p = Proxy(RouteConfig(backends=bk, router="sfs-cc", port=1, ties=ties), Clock())
    assert p.router.tie.ties == ties and len(p.router.groups.members) == 3
