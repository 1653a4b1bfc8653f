"""Seeded fuzzing of the request path (marker ``fuzz``): malformed clients
against a real ``latroute serve`` and a real ``latroute route``, the
proxy's backend a fake whose answer to each request is drawn too (usage
counts of any JSON value, bodies of any bytes, streams with or without
tokens, 5xx). After every request both servers' ``/health`` answer within
100 ms and each holds under 1 GiB; at SIGTERM both exit 0 with no traceback, the recording holds
every request ``serve`` answered 200 and the decision log every request
``route`` did not refuse (a refusal, 4xx, consumes nothing and is not
logged; the fake never answers 4xx itself)."""
from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.harness.route.test_route_live import _read_log, _stop
from tests.harness.route.test_route_untrusted import HEALTH_MS, _no_traceback, _proxy
from tests.harness.serve.test_serve_http import start_serve
from tests.support.misbehaving_peers import TOKEN_EVENT, FakeBackend, completion, health_ms, raw_request, sse, status_of

pytest.importorskip("aiohttp")
pytestmark = pytest.mark.fuzz

EXAMPLES = int(os.environ.get("LATROUTE_FUZZ_EXAMPLES", "150"))

scalars = st.none() | st.booleans() | st.integers(-(10**30), 10**30) | st.floats() | st.text(max_size=12)
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                      max_leaves=12)


def _dumps(v) -> bytes:
    return json.dumps(v, allow_nan=True).encode()


good_prompt = st.sampled_from(["w1 w2", [5, 6, 7], ["w3"], [[8, 9]]])
completions = st.fixed_dictionaries(
    {"prompt": good_prompt | values, "max_tokens": st.integers(1, 6) | values.filter(lambda v: v is not None)},
    optional={"stream": st.booleans() | values, "model": values, "stream_options": values,
              "latroute": values, "cache_salt": values, "min_tokens": values})
chats = st.fixed_dictionaries(
    {"messages": st.lists(st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system"]) | values,
         "content": st.text(max_size=10) | st.lists(st.fixed_dictionaries({"type": st.just("text") | values,
                                                                           "text": st.text(max_size=6) | values}),
                                                    max_size=3) | values}), max_size=3) | values,
     "max_tokens": st.integers(1, 6) | values.filter(lambda v: v is not None)})
bodies = (completions.map(lambda b: ("/v1/completions", _dumps(b)))
          | chats.map(lambda b: ("/v1/chat/completions", _dumps(b)))
          | st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), st.binary(max_size=64))
          | st.integers(2, 3000).map(lambda d: ("/v1/completions", b"[" * d + b"]" * d)))
request_ids = st.none() | st.from_regex(r"[A-Za-z0-9._~-]{1,24}", fullmatch=True) | st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\r\n"),
                                  min_size=0, max_size=40)
usages = (st.integers(-(10**40), 10**40).map(str) | st.sampled_from(["NaN", "Infinity", "-Infinity", "1e300", "2.5"])
          | values.map(lambda v: json.dumps(v)))


def _behaviour(kind: str, usage: str, junk: bytes):
    if kind == "usage":
        return lambda h: h.answer(200, completion(usage))
    if kind == "junk":
        return lambda h: h.answer(200, junk)
    if kind == "5xx":
        return lambda h: h.answer(503, b'{"error": {"message": "busy", "code": 503}}')
    if kind == "stream":
        return lambda h: h.answer(200, sse(TOKEN_EVENT, b'{"choices": [], "usage": {"completion_tokens": '
                                           + usage.encode() + b"}}", b"[DONE]"), "text/event-stream")
    return lambda h: h.endless(b"", junk or b"data: {}\n\n", "text/event-stream")


behaviours = st.tuples(st.sampled_from(["usage", "junk", "5xx", "stream", "endless"]), usages, st.binary(max_size=64))


def _raw(path: str, body: bytes, rid: bytes | None) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n").encode()
    if rid is not None:
        head += b"X-Request-Id: " + rid + b"\r\n"
    return head + b"\r\n" + body


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz-untrusted")
    fake = FakeBackend()
    serve, base = start_serve(tmp, "--record", str(tmp / "rec"))
    proxy, port = _proxy(tmp, fake, tmp / "log")
    run = {"fake": fake, "base": base, "port": port, "procs": (serve, proxy), "tmp": tmp, "serve_ok": set(),
           "route_taken": set(), "n": 0}
    yield run
    for p in (serve, proxy):
        if p.poll() is None:
            p.kill()
            p.wait()
    fake.close()


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: each example costs two servers' round trips
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(body=bodies, rid=request_ids, behaviour=behaviours)
# one well-formed request with a valid id first, whatever the draws: the runs' end checks what was kept
@example(body=("/v1/completions", b'{"prompt": "w1 w2", "max_tokens": 2}'), rid="fuzz-well-formed",
         behaviour=("usage", "2", b""))
def test_fuzzed_clients_and_backend(servers, body, rid, behaviour):
    run = servers
    run["n"] += 1
    n = run["n"]
    path, data = body
    key = f"k{n}"
    run["fake"].plan[key] = _behaviour(*behaviour)
    raw_id = None if rid is None else rid.encode("latin-1")
    got = raw_request(run["base"], _raw(path, data, raw_id), timeout=20)
    code = status_of(got)
    assert code in (200, 400, 404), got[:300]
    if code == 200 and rid is not None:
        run["serve_ok"].add(rid)
    routed_id = f"{key}:{n}"  # the proxy: the same body, an id that picks the fake's behaviour
    got = raw_request(run["port"], _raw(path, data, routed_id.encode()), timeout=30)
    code = status_of(got)
    assert code in (200, 400, 404, 502, 503), got[:300]
    if not 400 <= code < 500:
        run["route_taken"].add(routed_id)
    assert health_ms(run["base"]) < HEALTH_MS and health_ms(run["port"]) < HEALTH_MS
    for proc in run["procs"]:  # memory bounded whatever the clients and the backend sent
        assert rss_bytes(proc.pid) < RSS_LIMIT, (proc.args, rss_bytes(proc.pid))


RSS_LIMIT = 1 << 30  # bytes a server may hold during the fuzz (each starts near 150-250 MB)


def rss_bytes(pid: int) -> int:
    """The process's resident set (Linux ``/proc``; 0 where there is none)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def test_fuzzed_runs_end_whole(servers):
    """After the fuzzing (tests run in file order): SIGTERM; both exit 0
    with no traceback and lose nothing."""
    run = servers
    assert run["n"] > 0 and run["serve_ok"] and run["route_taken"]  # the fuzz got past the checks, both ways
    for p in run["procs"]:
        out, err = _stop(p)
        assert p.returncode == 0, err[-3000:]
        _no_traceback(err)
    from traces.store import open_trace

    rec = open_trace(run["tmp"] / "rec").read("requests")
    assert run["serve_ok"] <= set(rec["client_id"])
    req, _, _ = _read_log(run["tmp"] / "log")
    assert set(req["client_id"]) == run["route_taken"]
