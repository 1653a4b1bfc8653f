"""Regenerate the tables of docs/results/serve-faithfulness.md:
is an emulated run (``latroute serve`` driven by ``loadgen``) the offline
twin's, request for request?

Why a script: one measurement is four processes in order (an offline
replay that fixes arrivals and assignment, a server, a client, SIGTERM to
the server) and a comparison; the script runs them on loopback, bounded in
time, and prints the figures the page's targets name.

``latroute study serve-faithfulness OUT_DIR --pool POOL --rate R --requests N --port-base P [--stream-interval K]``
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def latroute(*args, **kw) -> subprocess.Popen:
    print("latroute", " ".join(map(str, args)), flush=True)
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *map(str, args)], **kw)


def wait_healthy(url: str, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} not healthy after {seconds} s")


def measure(out: Path, pool_ref: str, rate: float, n: int, port_base: int, stream_interval: int) -> None:
    from harness.twin.pools.spec import load_pool

    out.mkdir(parents=True, exist_ok=True)
    pool = load_pool(pool_ref)
    if latroute("replay", "--pool", pool_ref, "--rate", rate, "--requests", n, "--router", "shortest-queue",
                "--noise", "off", "--force", "--out", out / "r-sq", stdout=subprocess.DEVNULL).wait(900):
        raise SystemExit("replay failed")
    extra = ["--stream-interval", stream_interval] if stream_interval > 1 else []
    with open(out / "serve.txt", "w") as log:
        server = latroute("serve", "--pool", pool_ref, "--port-base", port_base, "--noise", "off",
                          "--frontend-overhead", "0.0025", "--record", out / "rec", "--force", *extra,
                          stdout=subprocess.DEVNULL, stderr=log)
    try:
        urls = [f"http://127.0.0.1:{port_base + i}" for i in range(len(pool.instances))]
        wait_healthy(urls[0], 120)
        client = latroute("loadgen", "--backends", ",".join(urls), "--trace", out / "r-sq" / "served",
                          "--assign-from", out / "r-sq", "--out", out / "client", "--force",
                          stdout=subprocess.DEVNULL)
        if client.wait(n / rate + 600):
            raise SystemExit("loadgen failed")
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)


def compare(out: Path, pool_ref: str) -> dict:
    import numpy as np

    from harness.serve.faithful import offline_on_served
    from harness.twin.fidelity.decisions import decision_agreement
    from harness.twin.pools.spec import load_pool
    from traces.store import open_trace

    rec = open_trace(out / "rec")
    off = offline_on_served(rec, load_pool(pool_ref))
    client = open_trace(out / "client").read("requests")[["client_id", "ttft_s"]]
    m = off.merge(client.rename(columns={"ttft_s": "client"}), on="client_id")
    d = np.abs(m["client"].to_numpy() - m["offline"].to_numpy()) * 1e3
    engine = (m["served"] - m["offline"]).to_numpy() * 1e3
    lag = json.loads((out / "rec" / "meta.json").read_text())["serve"]["lag"]
    steps = agree = 0
    for iid in rec.read("instances")["instance_id"]:
        r = decision_agreement(rec, str(iid))
        steps, agree = steps + r.steps, agree + r.agree
    return {"requests": len(m), "median_ms": float(np.median(d)), "p99_ms": float(np.percentile(d, 99)),
            "median_limit_ms": lag["p50_ms"] + 1, "p99_limit_ms": lag["p99_ms"] + 5,
            "lag_p50_ms": lag["p50_ms"], "lag_p99_ms": lag["p99_ms"], "lag_max_ms": lag["max_ms"],
            "late_over_5ms": lag["overruns"], "engine_minus_offline_ms": [float(engine.min()), float(engine.max())],
            "decision_agreement": f"{agree}/{steps}"}


def study(out: Path, pool: str, rate: float, requests: int, port_base: int, stream_interval: int) -> dict:
    """Measure and compare; the comparison's figures (also printed by the command)."""
    os.environ.setdefault("PYTHONPATH", str(REPO))
    measure(out, pool, rate, requests, port_base, stream_interval)
    return compare(out, pool)
