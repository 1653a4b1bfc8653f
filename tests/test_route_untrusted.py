"""``latroute route`` against a backend that misbehaves and clients that
send what they should not: the proxy as a subprocess on 127.0.0.1, the
backend a fake written here (``tests.untrusted_peers``), every request
over HTTP. What must hold whatever they send: the client gets vLLM's
error body, the backend is marked dead with the reason, ``/health``
answers within 100 ms while it happens, no traceback reaches stderr, and
SIGTERM writes the decision log whole (every request, exit 0)."""
from __future__ import annotations

import json
import os
import select
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from harness.live.ports import free_port_base
from tests.test_route_live import _read_log, _start, _stop
from tests.test_serve_http import get, post
from tests.untrusted_peers import (
    TOKEN_EVENT,
    FakeBackend,
    completion,
    frame,
    health_ms,
    post_request,
    raw_request,
    sse,
    status_of,
)

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")

HEALTH_MS = 100.0
QUALITY = {"x-latroute-quality": "qwen3-0.6b=0.5"}


def _pool(tmp: Path, url: str, name: str = "fake") -> Path:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps({"name": name, "frontend_overhead_s": 0.0, "instances": [
        {"instance_id": "f0", "model": "qwen3-0.6b", "profile": "qwen3-0.6b-h100", "num_kv_blocks": 20000,
         "max_num_batched_tokens": 8192, "max_num_seqs": 64, "max_model_len": 4096, "url": url}]}))
    return path


def _proxy(tmp: Path, fake: FakeBackend, log: Path, *extra: str):
    port = free_port_base(1)
    p = _start(["route", "--pool", str(_pool(tmp, fake.url)), "--router", "shortest-queue", "--listen",
                f"127.0.0.1:{port}", "--log", str(log), *extra], tmp)
    return p, port


class Running:
    """A started ``latroute`` server (``p``) on ``port``: what it has written
    to stderr so far (``stderr_since``), and once stopped all of it (``err``)."""

    def __init__(self, p, port: int, log: Path | None = None):
        self.p, self.port, self.log, self.err = p, port, log, ""

    def stderr_since(self, settle: float = 0.05) -> str:
        """What reached stderr since the last call (after ``settle`` seconds for a late line)."""
        time.sleep(settle)
        fd, new = self.p.stderr.fileno(), b""
        while select.select([fd], [], [], 0)[0]:
            got = os.read(fd, 1 << 16)
            if not got:
                break
            new += got
        text = new.decode(errors="replace")
        self.err += text
        return text

    def stop(self) -> None:
        """SIGTERM; ``err`` then holds everything it wrote to stderr."""
        _, rest = _stop(self.p)
        self.err += rest

    def clean(self) -> None:
        """It exited 0 at SIGTERM and wrote no traceback or internal error."""
        assert self.p.returncode == 0, f"exit {self.p.returncode}: {_what_broke(self.err)}\n{self.err[-3000:]}"
        _no_traceback(self.err)


@contextmanager
def stopped_cleanly(p, port: int, log: Path | None = None, *, also=None, check: bool = True):
    """Yields ``Running(p, port, log)``; leaving it, SIGTERM (and ``also()``,
    say a fake backend's close), then ``run.clean()``: exit 0 and no
    traceback on stderr. The test's own checks of what the server did come
    after the ``with``, so a server that died or left a traceback is reported
    as that first; ``check=False`` leaves ``run.clean()`` to the test (one
    that reports its cases by name first)."""
    run = Running(p, port, log)
    try:
        yield run
    finally:
        try:
            run.stop()
        finally:
            if also is not None:
                also()
    if check:
        run.clean()


def proxied(tmp: Path, fake: FakeBackend, *extra: str, check: bool = True):
    """``stopped_cleanly`` around a proxy in front of ``fake``, logging to ``tmp/log``."""
    log = tmp / "log"
    p, port = _proxy(tmp, fake, log, *extra)
    return stopped_cleanly(p, port, log, also=fake.close, check=check)


def _revived(port: int, timeout: float = 5.0) -> None:
    """Until the proxy's /health is 200 again (its dead backend revived by its /health)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if get(port, "/health")[0] == 200:
            return
        time.sleep(0.05)
    raise AssertionError("the backend was not revived")


def _while(port: int, call, limit: float = 30.0) -> tuple[object, float]:
    """``call()`` in a thread; meanwhile /health probed every 50 ms: (its result or what it
    raised, the slowest probe ms)."""
    out = {}

    def run():
        try:
            out["r"] = call()
        except Exception as e:  # noqa: BLE001 (the test reports it after the server's own checks)
            out["r"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    worst = 0.0
    deadline = time.monotonic() + limit
    while t.is_alive() and time.monotonic() < deadline:
        worst = max(worst, health_ms(port))
        time.sleep(0.05)
    t.join(limit)
    assert not t.is_alive(), "the request never ended"
    return out["r"], worst


def _vllm_error(body, status: int) -> None:
    assert _is_vllm_error(body, status), body


def _is_vllm_error(body, status: int) -> bool:
    return (isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], dict)
            and set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == status)


def _no_traceback(err: str) -> None:
    assert "Traceback" not in err and "internal error" not in err, f"{_what_broke(err)}\n{err[-3000:]}"


def _what_broke(err: str) -> str:
    """The lines of ``err`` that say what broke: its ``error:`` lines and the exception line ending each traceback."""
    said, in_traceback = [], False
    for line in err.splitlines():
        if line.startswith("Traceback (most recent call last)"):
            in_traceback = True
        elif in_traceback and line[:1] not in (" ", "\t", ""):
            said.append(line)
            in_traceback = False
        elif line.startswith("error:"):
            said.append(line)
    return " | ".join(dict.fromkeys(said)) or "(no error line)"


def _endless_json(h):
    h.endless(b'{"usage": {"completion_tokens": 1}, "x": "', b"a" * 65536)


def _tokenless_stream(h):
    h.endless(b"", b'data: {"choices": []}\n\n' * 2700, "text/event-stream")


def _streamed_usage(h):
    h.answer(200, sse(TOKEN_EVENT, b'{"choices": [], "usage": {"completion_tokens": 1e300}}', b"[DONE]"),
             "text/event-stream")


def _usage(raw: str):
    return lambda h: h.answer(200, completion(raw))


def _deep_json(h):
    h.answer(200, b"[" * 100_000 + b"]" * 100_000)


# (id, the bad answers sent in turn: (the fake's answer, streamed, what the proxy's reason for marking the
# backend dead says)); each case a proxy of its own, the cases beside the listed ones sharing one
BACKEND_ANSWERS = [
    *[(f"usage {raw}", [(_usage(raw), False, "completion_tokens")]) for raw in
      ["1000000000000000000000000000000", "1e300", "Infinity", "-5"]],
    ("endless body", [(_endless_json, False, "longer than")]),
    ("stream without tokens", [(_tokenless_stream, True, "without a token")]),
    ("usage 7.5, '3', 9 > max_tokens; streamed usage 1e300; json 100000 deep",
     [*[(_usage(raw), False, "completion_tokens") for raw in ["7.5", '"3"', "9"]],
      (_streamed_usage, True, "completion_tokens"), (_deep_json, False, "not JSON")]),
]


@pytest.mark.parametrize("answers", [a[1] for a in BACKEND_ANSWERS], ids=[a[0] for a in BACKEND_ANSWERS])
def test_route_survives_what_a_backend_answers(tmp_path, answers):
    """A usage count out of range, an endless answer, a stream of chunks
    without tokens, a streamed usage of 1e300, JSON nested past any parser:
    each request fails with vLLM's error body (or, once its first token went
    out, an error event) and the backend with the reason, /health stays
    quick meanwhile, the backend is revived for the next request, and the
    log has every request whole."""
    fake = FakeBackend()
    sent = []
    with proxied(tmp_path, fake) as run:
        for k, (answer, stream, _) in enumerate(answers):
            fake.plan[f"bad{k}"] = answer
            sent.append(_while(run.port, lambda k=k, stream=stream: post(
                run.port, "/v1/completions", {"prompt": "w1 w2 w3", "max_tokens": 8, "stream": stream},
                {"X-Request-Id": f"bad{k}:1", **QUALITY})))
            _revived(run.port)
        good = post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 8},
                    {"X-Request-Id": "good:1", **QUALITY})
    req, dec, meta = _read_log(run.log)
    bad = [f"bad{k}:1" for k in range(len(answers))]
    assert sorted(req["client_id"]) == sorted([*bad, "good:1"])  # every request, whole
    rows = req.set_index("client_id")
    assert (rows.loc[bad, "status"] == "error").all(), rows.loc[bad, ["status", "output_tokens"]].to_dict()
    assert rows.loc["good:1", "status"] == "ok" and rows.loc["good:1", "output_tokens"] == 1
    assert (req["output_tokens"] <= 8).all()
    for (answer, worst), (_, stream, _) in zip(sent, answers):
        assert worst < HEALTH_MS, f"/health took {worst:.0f} ms"
        assert not isinstance(answer, Exception), f"no answer the client could read: {answer!r}"
        status, body, _ = answer
        if not (stream and status == 200):  # once the first token went out, the failure is an error event
            assert status == 502, (status, body)
            _vllm_error(body, 502)
    assert good[0] == 200 and good[1]["usage"]["completion_tokens"] == 1, good
    reasons = " | ".join(e["reason"] for e in meta["route"]["events"] if e["event"] == "dead")
    assert all(reason in reasons for _, _, reason in answers), reasons


def test_refused_requests_use_no_capacity(tmp_path):
    """--capacity 3: five requests refused (no quality, under --quality
    request; bad JSON; a bad X-Request-Id), then three good ones all served."""
    with proxied(tmp_path, FakeBackend(), "--capacity", "3", "--quality", "request") as run:
        refused = [post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2})[0] for _ in range(3)]
        refused.append(post(run.port, "/v1/completions", b"{nope", QUALITY)[0])
        refused.append(post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2},
                            {"X-Request-Id": "a b", **QUALITY})[0])
        good = [post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2},
                     {"X-Request-Id": f"ok{k}", **QUALITY}) for k in range(3)]
        over = post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2}, QUALITY)
    assert refused == [400] * 5
    assert [g[0] for g in good] == [200] * 3, good  # the refusals took none of the three places
    assert over[0] == 503 and "capacity" in over[1]["error"]["message"]


def _malformed() -> list[tuple[str, bytes, int]]:
    """(what, raw request, the status vLLM's server answers) of every
    malformed client request: 400 for the body and the request id, the
    HTTP layer's refusal (4xx) for the framing."""
    deep = b"[" * 100_000 + b"]" * 100_000
    cases = [("json 2000 deep", b'{"prompt": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400),
             ("json 100000 deep", deep, 400),
             ("prompt 990 deep", b'{"prompt": ' + b"[" * 990 + b"1" + b"]" * 990 + b', "max_tokens": 2}', 400),
             ("prompt 3 deep", b'{"prompt": [[[1]]], "max_tokens": 2}', 400)]
    for text in (5, None, ["w1"], {"a": 1}):
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}], "max_tokens": 2}
        cases.append((f"content part text {text!r}", ("chat", json.dumps(body).encode()), 400))
    good = json.dumps({"prompt": "w1 w2", "max_tokens": 2}).encode()
    out = []
    for what, body, status in cases:
        path = "/v1/completions"
        if isinstance(body, tuple):
            path, body = "/v1/chat/completions", body[1]
        out.append((what, post_request(path, body), status))
    out += [
        ("request id 10 KB", post_request("/v1/completions", good, {"X-Request-Id": "r" * 10_000}), 400),
        ("request id 300 chars", post_request("/v1/completions", good, {"X-Request-Id": "r" * 300}), 400),
        ("request id latin-1", post_request("/v1/completions", good, {"X-Request-Id": "caf\xe9"}), 400),
        ("request id CR", post_request("/v1/completions", good, {"X-Request-Id": "a\rb"}), 400),
        ("request id LF", post_request("/v1/completions", good, {"X-Request-Id": "a\nb"}), 400),
        ("negative content-length", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n"
                                    b"Connection: close\r\n\r\n" + good, 400),
        ("bad chunked", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                        b"Connection: close\r\n\r\nzz\r\n" + good + b"\r\n0\r\n\r\n", 400),
        ("thousands of headers", post_request("/v1/completions", good,
                                              {f"X-H{k}": "v" for k in range(5000)}), 400),
    ]
    return out


def _refused_quietly(run: Running) -> dict[str, str]:
    """Every malformed request sent to ``run`` (then a client that half-closes
    after a good one): what went wrong with each, by case; empty when each was
    answered as vLLM answers it, /health stayed quick and nothing reached stderr."""
    problems = {}
    for what, raw, status in _malformed():
        got = raw_request(run.port, raw)
        code = status_of(got)
        head, _, body = got.partition(b"\r\n\r\n")
        if not (code == status or (status == 400 and 400 <= code < 500 and code != 404)):
            problems[what] = f"answered {got[:160]!r}"
        elif code == 400 and b"application/json" in head and not _is_vllm_error(json.loads(body), 400):
            problems[what] = f"not vLLM's error body: {body[:160]!r}"
        if (ms := health_ms(run.port)) >= HEALTH_MS:
            problems[what] = f"/health took {ms:.0f} ms after it"
        if "Traceback" in (err := run.stderr_since()):
            problems[what] = "traceback: " + _what_broke(err)[:200]
    # a client that half-closes after its request still gets the answer
    body = json.dumps({"prompt": "w1 w2", "max_tokens": 2}).encode()
    got = raw_request(run.port, post_request("/v1/completions", body, {"X-Request-Id": "half-1"}, close=False),
                      half_close=True)
    if status_of(got) != 200:
        problems["half-closed client"] = f"answered {got[:160]!r}"
    return problems


def test_route_refuses_malformed_clients_quietly(tmp_path):
    with proxied(tmp_path, FakeBackend(), check=False) as run:
        problems = _refused_quietly(run)
        after = post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2}, {"X-Request-Id": "after"})[0]
    assert not problems, "".join(f"\n  {what}: {why}" for what, why in problems.items())
    assert after == 200
    run.clean()
    req, _, _ = _read_log(run.log)
    assert sorted(req["client_id"]) == ["after", "half-1"] and (req["status"] == "ok").all()


def _metrics_page(running: str) -> bytes:
    return f"vllm:num_requests_running {running}\nvllm:num_requests_waiting 0\n".encode()


@pytest.mark.parametrize("value", ["1e12", "100000", "NaN", "+Inf"])
def test_metrics_view_bounds_gauges_and_keeps_polling(tmp_path, value):
    """A gauge of 1e12 or 100,000 running requests is bounded by the
    instance's max_num_seqs (the decision stays quick, SIGTERM is obeyed); a
    NaN or +Inf gauge fails the backend with the reason, and the poller lives
    on: a good page after it is read (its residents reach the log)."""
    fake = FakeBackend()
    page = {"v": _metrics_page(value)}
    fake.plan["/metrics"] = lambda h: h.answer(200, page["v"], "text/plain")
    took, health = [], []
    with proxied(tmp_path, fake, "--view", "metrics", "--poll-interval", "20") as run:
        for k, v in enumerate([value, "5"]):
            page["v"] = _metrics_page(v)
            time.sleep(0.3)
            _revived(run.port)
            time.sleep(0.1)
            t0 = time.monotonic()
            st, body, _ = post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2},
                               {"X-Request-Id": f"m{k}"})
            took.append(time.monotonic() - t0)
            health.append(health_ms(run.port))
            assert st in (200, 503), body
    req, dec, meta = _read_log(run.log)
    assert max(took) < 2.0 and max(health) < HEALTH_MS, (took, health)
    assert len(req) == 2
    assert dec["residents"].max() <= 64 + 2  # stand-ins bounded by max_num_seqs
    last = dec[dec["request_id"] == req.set_index("client_id").loc["m1", "request_id"]]
    assert (last["residents"] >= 5).all(), "the poller did not read the good page after the bad one"
    if value in ("NaN", "+Inf"):
        reasons = " | ".join(e["reason"] for e in meta["route"]["events"])
        assert value.strip("+").lower() in reasons.lower(), reasons


def _good_head(rows: int = 0, cap: int = 8, width: int | None = None) -> tuple[dict, bytes]:
    from estimators.engine.layout import NS, S_CAP, S_NFREE_SLOTS
    from estimators.engine.state import SchedState
    from harness.twin.pools.spec import load_pool

    cfg = load_pool("qwen3-h100").instances[0]
    w = SchedState.new(cfg, capacity=8).req.shape[1] if width is None else width
    sc = np.zeros(NS, dtype=np.int64)
    sc[S_CAP], sc[S_NFREE_SLOTS] = cap, cap
    arrays = [np.zeros(rows * w, dtype=np.int64), sc, np.zeros(cap, dtype=np.int64), np.zeros(cap, dtype=np.int64),
              np.arange(cap, dtype=np.int64)]
    head = {"t": 0.0, "cap": cap, "width": w, "rows": rows, "n_inbox": 0, "infl_n": 0, "infl_start": None,
            "wake_s": None, "ids": {}, "sizes": [int(a.size) for a in arrays] + [0, 0, 0, 0]}
    return head, b"".join(a.tobytes() for a in arrays)


@pytest.mark.parametrize("kind", ["garbage", "header-not-json", "rows-lie", "cap-1e12", "length-2^60"])
def test_exact_view_refuses_a_malformed_frame(tmp_path, kind):
    """A frame the proxy cannot use fails the backend (logged with the
    reason), the client's request gets vLLM's error body (never a bare 500)
    and its row is closed, not left open; a 2^60 length is refused, not
    waited for while the view is reported current."""
    head, body = _good_head()
    if kind == "garbage":
        bad = frame(b"\xff" * 3, b"\x00" * 5)
    elif kind == "header-not-json":
        bad = frame(b"{not json", body)
    elif kind == "rows-lie":
        bad = frame({**head, "rows": 5}, body)
    elif kind == "cap-1e12":
        bad = frame({**head, "cap": 10**12}, body)
    else:
        bad = frame(head, body, length=1 << 60)
    fake = FakeBackend()
    if kind == "length-2^60":  # the frame's bytes never end
        fake.plan["/latroute/state"] = lambda h: h.endless(bad, b"\x00" * 4096, "application/octet-stream")
    else:  # the one bad frame, then the feed stays open and quiet
        fake.plan["/latroute/state"] = lambda h: h.hold(bad)
    with proxied(tmp_path, fake, "--view", "exact") as run:
        time.sleep(0.5)
        answer, _ = _while(run.port, lambda: post(run.port, "/v1/completions", {"prompt": "w1", "max_tokens": 2},
                                                  {"X-Request-Id": "x1"}))
        health = health_ms(run.port)
    assert not isinstance(answer, Exception), f"no answer the client could read (a bare 500?): {answer!r}"
    st, answer, _ = answer
    assert st in (200, 503), answer
    if st == 503:
        _vllm_error(answer, 503)
    assert health < HEALTH_MS
    req, dec, meta = _read_log(run.log)
    assert list(req["status"]) != ["open"] and len(req) == 1
    dead = [e for e in meta["route"]["events"] if e["event"] == "dead"]
    assert dead and "state feed refused" in dead[0]["reason"], f"backend not marked dead: {meta['route']['events']}"


def test_clients_that_leave_mid_stream_end_their_requests(tmp_path):
    """40 clients leave a proxied stream after its first token: each row is
    ``abandoned``, nothing stays in flight, nothing reaches stderr."""
    from tests.test_serve_untrusted import _leave_mid_stream

    fake = FakeBackend()
    fake.plan["gone"] = lambda h: h.endless(b"", sse(TOKEN_EVENT), "text/event-stream")
    with proxied(tmp_path, fake) as run:
        for k in range(40):
            _leave_mid_stream(run.port, k)
        deadline = time.monotonic() + 10
        while b'latroute_route_in_flight{instance_id="f0"} 0.0' not in get(run.port, "/metrics")[1]:
            assert time.monotonic() < deadline, "requests left in flight after their clients left"
            time.sleep(0.1)
        assert get(run.port, "/health")[0] == 200  # a client leaving is not the backend's fault
    req, _, meta = _read_log(run.log)
    assert len(req) == 40 and (req["status"] == "abandoned").all()
    assert not [e for e in meta["route"]["events"] if e["event"] == "dead"]


@pytest.mark.parametrize("models", [b"[" * 200_000 + b"]" * 200_000, b'{"data": [{"id": "m", "max_model_len": 1e300}]}',
                                    b'{"data": [{"id": "m", "max_model_len": 1000000000000000000000000000000}]}',
                                    b'{"data": [7]}', b'{"data": [{"id": "a b\\n"}]}'],
                         ids=["deep", "float-len", "huge-len", "not-an-entry", "bad-name"])
def test_bare_backends_models_answer_is_checked(tmp_path, models):
    """Bare --backends take each model from the backend's /v1/models: an
    answer the proxy cannot use refuses --backends in one line (exit 2),
    before anything binds."""
    import subprocess
    import sys

    from tests.test_route_live import ENV, ROOT

    fake = FakeBackend()
    fake.plan["/v1/models"] = lambda h: h.answer(200, models)
    try:
        r = subprocess.run([sys.executable, "-m", "harness.cli", "route", "--backends", fake.url, "--profile",
                            "qwen3-0.6b-h100", "--quality", "request", "--router", "shortest-queue", "--listen",
                            f"127.0.0.1:{free_port_base(1)}"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=60)
    finally:
        fake.close()
    assert r.returncode == 2, r.stderr[-2000:]
    assert "--backends" in r.stderr and "/v1/models" in r.stderr and len(r.stderr.strip().splitlines()) == 1
