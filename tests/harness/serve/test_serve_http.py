"""``latroute serve`` as a real subprocess on 127.0.0.1, driven over HTTP.

One server for the module (start-up is a few seconds): the API answers,
malformed requests, /metrics through prometheus-client's parser, a client
that disconnects (its blocks back in the pool), and last SIGTERM in the
middle of a stream (error event, recording complete, the kernel agrees
with every recorded step)."""
from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from harness.live.ports import free_port_base  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
POOL = "qwen3-h100"
N_INST = 3
SPEED = 4.0


def free_base(n: int) -> int:
    """A port base with ``n`` free consecutive ports on 127.0.0.1."""
    return free_port_base(n)


def start_serve(tmp: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    base = free_base(N_INST)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", "serve", "--pool", POOL, "--port-base", str(base),
                          "--noise", "off", "--speed", str(SPEED), *extra], cwd=tmp, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    for line in p.stdout:
        if line.startswith("ready:"):
            return p, base
        if time.monotonic() > deadline:
            break
    p.kill()
    raise RuntimeError(f"serve did not start: {p.stderr.read()}")


def post(port: int, path: str, body, headers: dict | None = None) -> tuple[int, dict, dict]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    c.request("POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    out = r.status, json.loads(r.read() or b"null"), dict(r.getheaders())
    c.close()
    return out


def get(port: int, path: str) -> tuple[int, bytes]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", path)
    r = c.getresponse()
    out = r.status, r.read()
    c.close()
    return out


def metrics(port: int) -> dict:
    """{(name, frozenset(labels.items())): value} of every sample."""
    _, text = get(port, "/metrics")
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text.decode()) for s in fam.samples}


def gauge(port: int, name: str) -> float:
    return next(v for (n, _), v in metrics(port).items() if n == name)


def open_stream(port: int, body: dict, rid: str) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/completions", json.dumps({**body, "stream": True}).encode(),
              {"Content-Type": "application/json", "X-Request-Id": rid})
    return c, c.getresponse()


def events(resp, limit: int | None = None) -> list:
    out = []
    for raw in resp:
        line = raw.strip()
        if not line:
            continue
        assert line.startswith(b"data: ")
        payload = line[6:]
        out.append("[DONE]" if payload == b"[DONE]" else json.loads(payload))
        if out[-1] == "[DONE]" or (limit is not None and len(out) >= limit):
            break
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    p, base = start_serve(tmp, "--record", str(tmp / "rec"))
    yield p, base, tmp
    if p.poll() is None:
        p.kill()
        p.wait()


def test_api_answers_like_vllm(server):
    _, base, _ = server
    assert get(base, "/health")[0] == 200
    models = json.loads(get(base + 1, "/v1/models")[1])
    assert [m["id"] for m in models["data"]] == ["qwen3-8b"]
    st, body, headers = post(base, "/v1/completions", {"prompt": "w5 w6 w7 other", "max_tokens": 4},
                             {"X-Request-Id": "req-1"})
    assert st == 200 and body["id"] == "cmpl-req-1" and headers["X-Request-Id"] == "req-1"
    words = body["choices"][0]["text"].split()
    assert len(words) == 4 and all(w[0] == "w" and 3 <= int(w[1:]) < 8192 for w in words)
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 4, "total_tokens": 8,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    st, chat, _ = post(base + 2, "/v1/chat/completions",
                       {"messages": [{"role": "system", "content": "w1 w2"}, {"role": "user", "content": "w3"}],
                        "max_tokens": 3, "min_tokens": 3, "ignore_eos": True})
    assert st == 200 and chat["usage"]["prompt_tokens"] == 5  # <s> w1 w2 <s> w3
    assert len(chat["choices"][0]["message"]["content"].split()) == 3
    c, resp = open_stream(base, {"prompt": list(range(10, 60)), "max_tokens": 6,
                                 "stream_options": {"include_usage": True}}, "req-s")
    ev = events(resp)
    c.close()
    assert ev[-1] == "[DONE]"
    tokens = [e for e in ev[:-1] if e["choices"] and e["choices"][0]["text"]]
    assert len(tokens) == 6  # one event per step, each with its token
    assert ev[-3]["choices"][0]["finish_reason"] == "length" and ev[-2]["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    ({"max_tokens": 3}, 400, "prompt"),
    ({"prompt": [1, 2], "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": 40960}, 400, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": "3"}, 400, "max_tokens"),
    ({"prompt": [1, 2], "max_tokens": 3, "min_tokens": 5}, 400, "min_tokens"),
    ({"prompt": [1, 99999]}, 400, "prompt"),
    ({"prompt": [1, 2], "model": "gpt-9"}, 404, "model"),
])
def test_malformed_requests_get_vllm_error_body(server, body, status, param):
    _, base, _ = server
    st, err, _ = post(base, "/v1/completions", body)
    assert st == status
    assert set(err) == {"error"} and set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["code"] == status and err["error"]["param"] == param and err["error"]["message"]
    assert post(base, "/v1/completions", {"prompt": [1, 2], "max_tokens": 1})[0] == 200  # still serving


def test_metrics_names_and_labels(server):
    _, base, _ = server
    before = metrics(base + 1)
    key = ("vllm:generation_tokens_total", frozenset({"model_name": "qwen3-8b", "engine": "0"}.items()))
    post(base + 1, "/v1/completions", {"prompt": [5] * 20, "max_tokens": 7})
    after = metrics(base + 1)
    assert after[key] - before.get(key, 0.0) == 7
    names = {n for n, _ in after}
    for want in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
                 "vllm:e2e_request_latency_seconds_bucket", "vllm:request_queue_time_seconds_bucket"):
        assert want in names, want
    for (n, labels), _v in after.items():
        keys = {k for k, _ in labels} - {"le", "finished_reason"}
        assert keys == {"model_name", "engine"}, n


def test_metrics_are_those_of_a_real_vllm_0_32(server):
    """Every family served has a real vLLM 0.32 server's name, type and label
    keys (fixture captured once from ``vllm.entrypoints.openai.api_server``
    on tiny-a), and the ones a router or dashboard reads are all there."""
    _, base, _ = server
    real = json.loads((ROOT / "tests" / "data" / "vllm_0_32_metrics.json").read_text())["metrics"]
    _, text = get(base, "/metrics")
    ours = {}
    for fam in text_string_to_metric_families(text.decode()):
        ours[fam.name] = (fam.type, sorted({k for s_ in fam.samples for k in s_.labels} - {"le"}))
    for name, (kind, labels) in ours.items():
        assert name in real, name
        assert (kind, labels) == (real[name]["type"], real[name]["labels"]), name
    for want in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:num_preemptions", "vllm:prompt_tokens",
                 "vllm:generation_tokens", "vllm:request_success"):
        assert want in ours and want in real, want


def test_disconnect_frees_blocks(server):
    _, base, _ = server
    port = base + 2
    c, resp = open_stream(port, {"prompt": [7] * 3000, "max_tokens": 20000}, "gone-1")
    first = events(resp, limit=3)
    assert len(first) == 3 and all(e != "[DONE]" for e in first)
    assert gauge(port, "vllm:num_requests_running") == 1 and gauge(port, "vllm:kv_cache_usage_perc") > 0
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and gauge(port, "vllm:kv_cache_usage_perc") > 0:
        time.sleep(0.05)
    assert gauge(port, "vllm:kv_cache_usage_perc") == 0.0  # every block back in the pool
    assert gauge(port, "vllm:num_requests_running") == 0
    m = metrics(port)
    assert m[("vllm:request_success_total", frozenset({"model_name": "qwen3-32b", "engine": "0",
                                                       "finished_reason": "abort"}.items()))] >= 1


def test_sigterm_ends_streams_and_writes_the_recording(server):
    """The recording holds a finished request, an aborted one and the stream SIGTERM cut, all sent here (the
    module's other tests may run on another pytest-xdist worker, with a server of their own)."""
    p, base, tmp = server
    for k in range(2):  # every instance steps (the third one below)
        st, _, _ = post(base + k, "/v1/completions", {"prompt": "w5 w6 w7", "max_tokens": 3},
                        {"X-Request-Id": f"done-{k}"})
        assert st == 200
    gone_port = base + 2
    g, gresp = open_stream(gone_port, {"prompt": [7] * 3000, "max_tokens": 20000}, "gone-2")
    assert len(events(gresp, limit=3)) == 3
    g.sock.shutdown(socket.SHUT_RDWR)
    g.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and gauge(gone_port, "vllm:num_requests_running") > 0:
        time.sleep(0.05)
    c, resp = open_stream(base, {"prompt": [9] * 100, "max_tokens": 30000}, "cut-1")
    assert len(events(resp, limit=2)) == 2
    p.send_signal(signal.SIGTERM)
    rest = events(resp)
    c.close()
    assert rest[-1] == "[DONE]" and "error" in rest[-2] and rest[-2]["error"]["code"] == 503
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert "serve lag:" in out and "wrote" in out
    from harness.twin.fidelity.decisions import decision_agreement
    from traces.store import open_trace

    t = open_trace(tmp / "rec")
    req = t.read("requests")
    assert {"done-0", "done-1", "gone-2", "cut-1"} <= set(req["client_id"])
    gone = req[req["client_id"] == "gone-2"].iloc[0]
    assert gone["finish_reason"] == "abort" and 3 <= gone["output_tokens"] < 20000
    assert t.meta["serve"]["lag"]["step_ends"] > 0
    items = t.read("step_items")
    assert gone["request_id"] in set(items["request_id"])
    for inst in t.read("instances")["instance_id"]:
        r = decision_agreement(t, inst)
        assert r.steps > 0 and r.agree == r.steps, (inst, r.to_json(3))
