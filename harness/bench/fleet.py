"""The twin at fleet size (``latroute bench --only fleet``): simulated
*instance*-seconds per wall second on pools of 3, 24, 96 and 384 instances
(qwen3-h100 and its replica pools -x8, -x32, -x128) at the paper's load per
instance (8 q/s per three instances), for shortest-queue and sfs-cc (with
its default replica choice, ``random``, and with ``lowest-index``, the one
order of a checkout before the two-level routers), with each cell's peak
memory; and the same cells on another checkout in the same
run (``against``), so a speed-up is a ratio measured under one machine load.

Why instance-seconds: a pool of n instances simulated for S seconds is n*S
of engine work; a twin whose per-event cost does not grow with the pool
keeps this figure flat as n grows. Each cell runs in its own child process
(``harness/bench/fleet_cell.py``, copied out of the package so that
``PYTHONPATH`` alone chooses the checkout): its compile and first-call
warm-up is reported apart, and its peak resident memory is its own.

Memory for an hour of traffic at 384 instances is estimated, not run:
two replays of 40 and 120 simulated seconds on the 384-instance pool give
the memory per request, and the hour is extrapolated along it (a full hour
was run once to check it; docs/results/fleet.md).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

POOLS = {3: "qwen3-h100", 24: "qwen3-h100-x8", 96: "qwen3-h100-x32", 384: "qwen3-h100-x128"}
# sfs-cc with the default replica choice (random), and with lowest-index: the one-level loop's one order,
# whose decision walks every full replica of the chosen model (the cost against --against, like for like)
ROUTERS = ("shortest-queue", "sfs-cc", "sfs-cc --ties lowest-index")
RATE_PER_INSTANCE = 8.0 / 3.0  # the paper's 8 q/s on three instances
CELL = Path(__file__).with_name("fleet_cell.py")


@dataclass(frozen=True)
class FleetBench:
    sizes: tuple[int, ...] = (3, 24, 96, 384)
    routers: tuple[str, ...] = ROUTERS
    seconds: float = 15.0  # arrivals span at least this many simulated seconds per cell
    instance_seconds: float = 2000.0  # ... and at least this many instance-seconds (small pools run longer)
    against: Path | None = None  # another checkout, benched on the same cells
    against_sizes: tuple[int, ...] = (3, 24, 96)  # its cells (an old twin at 384 instances takes minutes)
    memory: bool = True  # the per-request memory cells (for the hour at 384 instances)
    repeats: int = 3  # timed replays per cell (one warm-up): the median's figures
    seed: int = 0


def cell_requests(n_inst: int, cfg: FleetBench) -> int:
    span = max(cfg.seconds, cfg.instance_seconds / n_inst)
    return int(round(RATE_PER_INSTANCE * n_inst * span))


def run_cell(checkout: Path, pool: str, router: str, rate: float, requests: int, seed: int, tmp: Path,
             repeats: int = 1) -> dict:
    """One cell in a child whose ``PYTHONPATH`` is ``checkout``; ``router``
    may end in ``--ties POLICY``."""
    name, _, ties = router.partition(" --ties ")
    script = tmp / "latroute_fleet_cell.py"
    if not script.exists():
        shutil.copyfile(CELL, script)
    env = dict(os.environ, PYTHONPATH=str(checkout))
    proc = subprocess.run([sys.executable, str(script), pool, name, repr(rate), str(requests), str(seed),
                           ties or "-", str(repeats)],
                          capture_output=True, text=True, env=env, cwd=tmp)
    if proc.returncode != 0:
        raise RuntimeError(f"fleet cell {pool} {router} on {checkout} failed:\n{proc.stderr.strip()[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["router"] = router
    return out


def run(cfg: FleetBench = FleetBench(), echo=None) -> dict:  # noqa: B008 (frozen)
    """Every cell, this checkout's then ``against``'s; ``echo`` is called with
    each finished cell (progress)."""
    here = Path(__file__).resolve().parents[2]
    out: dict = {"rate_per_instance": RATE_PER_INSTANCE, "this": str(here), "cells": [], "against": None}
    checkouts = [("this", here, cfg.sizes)]
    if cfg.against is not None:
        out["against"] = str(cfg.against)
        checkouts.append(("against", cfg.against.resolve(), cfg.against_sizes))
    with tempfile.TemporaryDirectory(prefix="latroute-fleet-") as tmp:
        for router in cfg.routers:
            for n in sorted(set(cfg.sizes) | set(cfg.against_sizes if cfg.against else ())):
                for label, path, sizes in checkouts:
                    if n not in sizes or (label == "against" and " --ties " in router):
                        continue  # (another checkout: its routers' one replica order, benched once)
                    r = run_cell(path, POOLS[n], router, RATE_PER_INSTANCE * n, cell_requests(n, cfg), cfg.seed,
                                 Path(tmp), cfg.repeats)
                    r["checkout"] = label
                    out["cells"].append(r)
                    if echo is not None:
                        echo(r)
        if cfg.memory:
            out["memory"] = memory_estimate(here, out["cells"], cfg, Path(tmp))
    out["summary"] = summary(out["cells"])
    return out


def memory_estimate(here: Path, cells: list[dict], cfg: FleetBench, tmp: Path) -> dict:
    """Peak memory of an hour of traffic at the largest pool (shortest-queue,
    no step log): two replays of different length *on that pool*, and the
    hour extrapolated along their slope. Why on that pool: memory per request
    may grow with the instances (the utility tables once were N x J, which
    a slope on three instances missed by 19 GB)."""
    n = max(cfg.sizes)
    rate = RATE_PER_INSTANCE * n
    small, large = int(rate * 40), int(rate * 120)  # 40 and 120 simulated seconds
    a = run_cell(here, POOLS[n], "shortest-queue", rate, small, cfg.seed, tmp)
    b = run_cell(here, POOLS[n], "shortest-queue", rate, large, cfg.seed, tmp)
    per_req_kb = (b["peak_rss_mb"] - a["peak_rss_mb"]) * 1024.0 / (large - small)
    hour = int(rate * 3600)
    est_mb = b["peak_rss_mb"] + per_req_kb * (hour - large) / 1024.0
    return {"per_request_kb": per_req_kb, "base_instances": n, "base_requests": large,
            "base_peak_mb": b["peak_rss_mb"], "hour_requests": hour, "hour_estimate_mb": est_mb}


def summary(cells: list[dict]) -> dict:
    """Per router: this checkout's instance-seconds/s at n over that at 3,
    and this checkout's over the other's at each size both ran; the same
    for the twin's own speed (``twin_``: the replay less the decisions)."""
    res: dict = {}
    for router in sorted({c["router"] for c in cells}):
        mine = {c["instances"]: c for c in cells if c["router"] == router and c["checkout"] == "this"}
        plain = router.partition(" --ties ")[0]  # the other checkout's router of that name
        other = {c["instances"]: c for c in cells if c["router"] == plain and c["checkout"] == "against"}
        base = mine.get(min(mine)) if mine else None
        res[router] = {}
        for key, name in (("instance_s_per_s", ""), ("twin_instance_s_per_s", "twin_")):
            res[router][name + "vs_smallest"] = {n: c[key] / base[key] for n, c in sorted(mine.items())} \
                if base else {}
            res[router][name + "vs_against"] = {n: mine[n][key] / other[n][key] for n in sorted(set(mine) & set(other))}
    return res
