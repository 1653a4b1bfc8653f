"""SFS with prefix caching against a warm cache (``latroute bench --only sfs-cache``).

Pool qwen3-h100 with prefix caching on serves the multi-turn session
workload at 8 q/s (shortest-queue) for ten simulated minutes; at the first
arrival after that with at least ``min_residents`` requests on its busiest
instance (64 residents are not reached at this load: shortest-queue keeps
the instances far below), that instance's live view is taken and the next queries are estimated twice in
the same run: with the instance's prefix cache (read through SFS's overlay,
never copied) and on the same state with caching off (every prompt token
computed). The ratio of the medians is the cost of modelling the cache.
"""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from estimators.engine.layout import C_PREFIX
from estimators.sfs import SFS
from estimators.snapshot import Query
from harness.pools import load_pool
from harness.twin import Twin, TwinConfig, shortest_queue_router
from traces.sessions import SessionConfig, generate_sessions


def run(warm_s: float = 600.0, rate: float = 8.0, queries: int = 300, min_residents: int = 8,
        seed: int = 0) -> dict:
    pool = load_pool("qwen3-h100")
    pool = replace(pool, instances=tuple(replace(c, prefix_caching=True) for c in pool.instances))
    wl = generate_sessions(SessionConfig(duration_s=warm_s + 60.0, rate=rate, seed=seed)).requests
    twin = Twin.from_pool(pool, TwinConfig(seed=seed, record_steps=False))
    pred = wl["predicted_output_tokens"].to_numpy()
    out: dict = {}

    def probe(i, t, insts):
        if out or t < warm_s:
            return
        inst = max(insts, key=lambda x: x.residents)  # the busiest instance
        if inst.residents < min_residents:
            return
        on = inst.snapshot(t)
        cfg = on.state.cfg.copy()
        cfg[C_PREFIX] = 0
        off = replace(on, state=on.state._replace(cfg=cfg))
        sfs_on, sfs_off = SFS(inst.spec.profile, pred), SFS(inst.spec.profile, pred)
        ids = range(i, min(i + queries, len(wl)))
        us = {"on": [], "off": []}
        for k in ids:
            q = Query(k, t, int(wl["prompt_tokens"].iloc[k]))
            for name, est, view in (("on", sfs_on, on), ("off", sfs_off, off)):
                est.estimate(view, q)  # warm
                t0 = time.perf_counter_ns()
                est.estimate(view, q)
                us[name].append((time.perf_counter_ns() - t0) / 1e3)
        st = on.state
        out.update({"t_s": t, "instance": inst.instance_id, "residents": inst.residents, "queries": len(us["on"]),
                    "cached_free_blocks": int(st.bc.sc[6]), "free_blocks": int(st.sc[3]),
                    "median_us_on": float(np.median(us["on"])), "median_us_off": float(np.median(us["off"])),
                    "p99_us_on": float(np.percentile(us["on"], 99)), "p99_us_off": float(np.percentile(us["off"], 99)),
                    "fallbacks": sfs_on.fallbacks})
        out["ratio"] = out["median_us_on"] / out["median_us_off"]

    t0 = time.perf_counter()
    res = twin.run(wl, shortest_queue_router, on_arrival=probe, hash_block_tokens=16)
    wall = time.perf_counter() - t0
    out.update({"twin_wall_s": wall, "twin_simulated_s": res.sim_end_s,
                "twin_speedup": res.sim_end_s / wall if wall else None,
                "hit_rate": float(res.requests["cached_tokens"].sum() / res.requests["prompt_tokens"].sum()),
                "requests": len(wl)})
    return out
