"""What ``latroute route`` costs in the request path (``python -m
harness.bench.route``).

Backends: one ``latroute serve`` process with three replicas of qwen3-8b
(noise off, speed 1: times are real), so every backend answers a request
alike and the proxy's choice does not change its TTFT at low load.

- **Added TTFT**: the same open-loop workload (seeded Poisson arrivals at
  ``--rate``, fixed lengths) sent by ``latroute loadgen`` straight to the
  backends (round robin) and then through the proxy, per router; each
  request's TTFT through the proxy minus its TTFT direct (paired by
  request id), p50 and p99, and the p50/p99 of each side.
- **Decisions per second**: closed loop, ``--concurrency`` requests in
  flight, one output token each, through the proxy: requests completed
  per second (the proxy, the backends and the client share this machine's
  cores, so this is a floor on the proxy's own rate), and the router's own
  mean decision time (its ``Router.decision_ns``), whose inverse is what
  the router alone could sustain.

Printed as one JSON object (and a table on stderr); load average beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from harness.live.ports import free_port_base
from harness.live.processes import loadgen, start_ready, stop

REPLICAS = 3
POOL = {"name": "bench-route", "frontend_overhead_s": 0.0, "instances": [
    {"instance_id": "q8", "model": "qwen3-8b", "profile": "qwen3-8b-h100", "num_kv_blocks": 20000,
     "max_num_batched_tokens": 8192, "max_num_seqs": 256, "max_model_len": 40960, "replicas": REPLICAS}]}


def _ttfts(path: Path) -> dict[int, float]:
    from traces.store import open_trace

    req = open_trace(path).read("requests")
    ok = req[req["status"] == "ok"]
    return dict(zip(ok["request_id"].tolist(), ok["ttft_s"].tolist()))


def _q(x, p: float) -> float:
    return float(np.quantile(np.asarray(x), p) * 1e3) if len(x) else float("nan")


def run(requests: int, rate: float, routers: list[str], saturate: int, concurrency: int, work: Path) -> dict:
    pool = work / "pool.json"
    pool.write_text(json.dumps(POOL))
    base = free_port_base(REPLICAS)
    urls = ",".join(f"http://127.0.0.1:{base + k}" for k in range(REPLICAS))
    shape = ["--request-rate", str(rate), "--input-len", "256", "--output-len", "16", "--seed", "0"]
    serve = start_ready(["serve", "--pool", str(pool), "--port-base", str(base), "--noise", "off"], work)
    out: dict = {"requests": requests, "rate": rate, "concurrency": concurrency, "saturate_requests": saturate,
                 "loadavg_before": os.getloadavg()[0], "routers": {}}
    try:
        loadgen(work, work / "warm", ["--backends", urls], ["--num-prompts", "30", *shape])  # the backends' first requests
        loadgen(work, work / "direct", ["--backends", urls], ["--num-prompts", str(requests), *shape])
        direct = _ttfts(work / "direct")
        out["direct_ttft_ms"] = {"p50": _q(list(direct.values()), 0.5), "p99": _q(list(direct.values()), 0.99)}
        for router in routers:
            port = free_port_base(1)
            proxy = start_ready(["route", "--pool", str(pool), "--backends", urls, "--router", router, "--listen",
                            f"127.0.0.1:{port}", "--no-log-estimates"], work)
            try:
                target = ["--base-url", f"http://127.0.0.1:{port}"]
                quality = ["--model", "qwen3-8b"]
                loadgen(work, work / f"warm-{router}", target, ["--num-prompts", "30", *shape, *quality])
                loadgen(work, work / f"via-{router}", target, ["--num-prompts", str(requests), *shape, *quality])
                via = _ttfts(work / f"via-{router}")
                sat = loadgen(work, work / f"sat-{router}", target,
                              ["--num-prompts", str(saturate), "--input-len", "64", "--output-len", "1", "--max-concurrency", str(concurrency),
                                "--seed", "1", *quality])
            finally:
                summary = stop(proxy)
            both = sorted(set(direct) & set(via))
            diff = [via[k] - direct[k] for k in both]
            m = re.search(r"mean ([0-9.]+) us each", summary)
            mean_us = float(m.group(1)) if m else float("nan")
            out["routers"][router] = {
                "paired": len(both), "added_ttft_ms": {"p50": _q(diff, 0.5), "p99": _q(diff, 0.99)},
                "proxy_ttft_ms": {"p50": _q(list(via.values()), 0.5), "p99": _q(list(via.values()), 0.99)},
                "saturated_requests_per_s": sat["request_throughput"], "saturated_failed": sat["failed"],
                "mean_decision_us": mean_us, "router_decisions_per_s": 1e6 / mean_us if mean_us > 0 else None}
    finally:
        stop(serve)
    out["loadavg_after"] = os.getloadavg()[0]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rate", type=float, default=10.0)
    ap.add_argument("--routers", default="shortest-queue,sfs-cc")
    ap.add_argument("--saturate", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        res = run(a.requests, a.rate, [r.strip() for r in a.routers.split(",")], a.saturate, a.concurrency, Path(d))
    print(json.dumps(res, indent=1))
    for r, v in res["routers"].items():
        print(f"{r}: added TTFT p50 {v['added_ttft_ms']['p50']:.2f} ms, p99 {v['added_ttft_ms']['p99']:.2f} ms "
              f"({v['paired']} paired); saturated {v['saturated_requests_per_s']:.0f} req/s; router alone "
              f"{v['mean_decision_us']:.1f} us/decision", file=sys.stderr)


if __name__ == "__main__":
    main()
