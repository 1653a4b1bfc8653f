"""Regenerate the scale table of docs/results/serve-faithfulness.md: how
large a pool, at what rate, one ``latroute serve`` process holds with
p99 step-delivery lag <= 5 ms beside its client, with and without
``--stream-interval``, and where its time goes.

Why a script: one point is a generated workload, a server, loadgen
(round robin over every instance, every token streamed) and SIGTERM to the
server, whose lag report is the measurement; with ``--profile`` a sampling
profiler (py-spy, outside latroute's environment) records the server and
its samples are sorted into kernel / HTTP / SSE writes / metrics / idle.

``latroute study serve-scale OUT --pool qwen3-h100-x8 --rate 16 --requests 800 --port-base 8100
[--stream-interval 10] [--py-spy PATH]``
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from harness.studies.serve_real_faithfulness import REPO, wait_healthy

LAG = re.compile(r"serve lag: (\d+) step ends, p50 ([\d.]+) ms, p99 ([\d.]+) ms, max ([\d.]+) ms; (\d+) handled")

# (function or "", file path part); the innermost frame that matches a rule names the sample's category
CATEGORIES = [
    ("epoll wait", (("select", "selectors.py"),)),
    ("SSE writes (socket send, aiohttp write, event JSON)", (
        ("write", "asyncio/selector_events.py"), ("write", "aiohttp/web_response.py"),
        ("send", "harness/serve/app.py"), ("flush", "harness/serve/app.py"))),
    ("metrics", (("", "harness/serve/metrics.py"), ("", "prometheus_client"))),
    ("kernel + engine", (("", "harness/twin/"), ("", "estimators/"), ("", "harness/serve/engine.py"))),
    ("HTTP (aiohttp, parsing, handlers)", (("", "aiohttp/"), ("", "harness/serve/app.py"),
                                           ("", "harness/serve/protocol.py"), ("", "harness/serve/prefix.py"))),
    ("asyncio loop", (("", "asyncio/"),)),
]


def category(stack: list[str]) -> str:
    for frame in reversed(stack):
        func, _, where = frame.partition(" (")
        func = func.rpartition(".")[2]  # py-spy names methods Class.method
        for name, rules in CATEGORIES:
            if any((not f or f == func) and part in where for f, part in rules):
                return name
    return "other"


def where_time_goes(raw: Path) -> dict:
    """py-spy's raw (collapsed) output: share of samples per category (py-spy
    drops samples of an idle thread, so these are shares of serve's busy
    time); with the sample count, at 100 Hz the CPU seconds."""
    c: Counter = Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack:
            c[category(stack.split(";"))] += int(n)
    total = sum(c.values()) or 1
    return {"samples": total, **{k: round(v / total * 100, 1) for k, v in c.most_common()}}


def latroute(*args, **kw) -> subprocess.Popen:
    print("latroute", " ".join(map(str, args)), flush=True)
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *map(str, args)], **kw)


def measure(out: Path, pool_ref: str, rate: float, n: int, port_base: int, interval: int, spy: str | None) -> dict:
    from harness.twin.pools.spec import load_pool
    from traces.store import open_trace

    out.mkdir(parents=True, exist_ok=True)
    if latroute("trace", "generate", "--out", out / "wl", "--requests", n, "--rate", rate, "--seed", 1, "--force",
                stdout=subprocess.DEVNULL).wait(300):
        raise SystemExit("generate failed")
    k = len(load_pool(pool_ref).instances)
    extra = ["--stream-interval", interval] if interval > 1 else []
    err = open(out / "serve.txt", "w+")
    server = latroute("serve", "--pool", pool_ref, "--port-base", port_base, "--noise", "off", *extra,
                      stdout=err, stderr=subprocess.STDOUT)
    prof = None
    try:
        urls = [f"http://127.0.0.1:{port_base + i}" for i in range(k)]
        wait_healthy(urls[-1], server, 300)
        if spy:
            prof = subprocess.Popen([spy, "record", "--pid", str(server.pid), "--rate", "100", "--format", "raw",
                                     "--nonblocking", "--output", str(out / "pyspy.txt")],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        t0 = time.monotonic()
        client = latroute("loadgen", "--backends", ",".join(urls), "--trace", out / "wl", "--out", out / "client",
                          "--force", stdout=subprocess.DEVNULL)
        if client.wait(n / rate + 600):
            raise SystemExit("loadgen failed")
        wall = time.monotonic() - t0
    finally:
        if prof is not None:
            prof.send_signal(signal.SIGINT)
            prof.wait(60)
        server.send_signal(signal.SIGTERM)
        server.wait(120)
    err.seek(0)
    m = LAG.search(err.read())
    if m is None:
        raise SystemExit("no lag report")
    req = open_trace(out / "client").read("requests")
    tokens = int(req["output_tokens"].sum())
    duration = float(json.loads((out / "client" / "bench.json").read_text())["duration"])
    res = {"pool": pool_ref, "instances": k, "rate": rate, "requests": n, "stream_interval": interval,
           "step_ends": int(m[1]), "lag_p50_ms": float(m[2]), "lag_p99_ms": float(m[3]), "lag_max_ms": float(m[4]),
           "late_over_5ms": int(m[5]), "tokens_per_s": round(tokens / duration), "sse_events_per_s":
           round(tokens / interval / duration), "failed": int((req["status"] != "ok").sum()),
           "loadgen_wall_s": round(wall, 1), "held": float(m[3]) <= 5.0}
    if prof is not None and (out / "pyspy.txt").is_file():
        res["time_shares_pct"] = where_time_goes(out / "pyspy.txt")
    (out / "result.json").write_text(json.dumps(res, indent=1))
    return res




def study(out: Path, pool: str, rate: float, requests: int, port_base: int, stream_interval: int,
          spy: str | None) -> dict:
    """One point of the scale table (the server's subprocesses import latroute from this checkout)."""
    os.environ.setdefault("PYTHONPATH", str(REPO))
    return measure(out, pool, rate, requests, port_base, stream_interval, spy)
