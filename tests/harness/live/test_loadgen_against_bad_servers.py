"""``loadgen`` against servers that never answer, answer nonsense, or fail
every request: every network wait ends within --time-limit, a
10,000-deep /v1/models is refused in one line naming the URL, and a run
with no successful request writes nothing (not even --out's parents)."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import run_cli
from tests.support.clean_refusal import refused_cleanly
from traces.store import open_trace

pytest.importorskip("aiohttp")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        mode = self.server.mode
        if mode == "silent":
            self.server.release.wait(30)  # never answers (until the test ends)
            return
        if mode == "nested":
            self._send(200, b"[" * 10000 + b"]" * 10000)
            return
        self._send(200, json.dumps({"data": [{"id": "m"}]}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.server.mode == "silent":
            # silent for every request: were the POST answered, a run whose
            # /v1/models probe timed out a few ms before --time-limit could
            # still finish its one request in time (a race, not a bound)
            self.server.release.wait(30)
            return
        rid = self.headers.get("X-Request-Id", "")
        if self.server.mode == "fail-all" or (self.server.mode == "fail-one" and rid == "r0"):
            self._send(500, b"no")
            return
        chunks = [b'data: {"choices": [{"index": 0, "text": "w5"}]}\n\n'] * body["max_tokens"]
        usage = {"choices": [], "usage": {"completion_tokens": body["max_tokens"]}}
        payload = b"".join(chunks) + f"data: {json.dumps(usage)}\n\n".encode() + b"data: [DONE]\n\n"
        self._send(200, payload, "text/event-stream")


class Server:
    def __init__(self, mode: str) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.mode = mode
        self.httpd.release = threading.Event()
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.httpd.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _bounded(args: list, limit_s: float):
    """run_cli in a thread; fails (instead of hanging the suite) past ``limit_s``."""
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("res", run_cli(*args)), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"loadgen still waiting after {limit_s} s"
    return box["res"], time.monotonic() - t0


@pytest.mark.parametrize("model", [[], pytest.param(["--model", "m"], marks=pytest.mark.fuzz)],
                         ids=["models", "probe"])
def test_time_limit_bounds_a_models_endpoint_that_never_answers(tmp_path, model):
    out = tmp_path / "a" / "c"
    with Server("silent") as url:
        res, took = _bounded(["loadgen", "--base-url", url, "--num-prompts", "1", "--time-limit", "0.5",
                              "--out", out, *model], 15)
    assert took < 8 and res.exit_code == 1, (took, res.output)
    assert not (tmp_path / "a").exists(), "a run with no successful request left directories behind"
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "nothing written" in lines[0], lines


def test_a_deeply_nested_models_answer_is_refused_naming_the_url(tmp_path):
    with Server("nested") as url:
        refused_cleanly(["loadgen", "--base-url", url, "--num-prompts", "1", "--out", tmp_path / "c"],
                        [tmp_path], f"{url}/v1/models", "nested deeper")


def test_unreachable_server_creates_no_directories(tmp_path):
    res, _ = _bounded(["loadgen", "--base-url", "http://127.0.0.1:9", "--num-prompts", "1",
                       "--out", tmp_path / "a" / "b" / "c"], 30)
    assert res.exit_code == 1 and "not reachable" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_every_request_failed_writes_nothing_some_failed_writes_all(tmp_path):
    with Server("fail-all") as url:
        res, _ = _bounded(["loadgen", "--base-url", url, "--num-prompts", "3", "--output-len", "2",
                           "--input-len", "4", "--out", tmp_path / "a" / "c"], 30)
    assert res.exit_code == 1 and "every request failed" in res.stderr, res.output
    assert list(tmp_path.iterdir()) == []
    with Server("fail-one") as url:
        res, _ = _bounded(["loadgen", "--base-url", url, "--num-prompts", "3", "--output-len", "2",
                           "--input-len", "4", "--out", tmp_path / "a" / "c"], 30)
    assert res.exit_code == 1 and "1 of 3 requests failed" in res.stderr, res.output
    t = open_trace(tmp_path / "a" / "c").read("requests").set_index("request_id").sort_index()
    assert list(t["status"]) == ["error", "ok", "ok"] and t.loc[0, "error"].startswith("HTTP 500")
    assert (tmp_path / "a" / "c" / "bench.json").is_file()
