"""Why SFS loses its lead on replica pools: one sweep cell
replayed with its router's every decision recorded.

Per request it records the replica chosen, the router's estimated TTFT of
that replica (the ``latency`` array latency-aware and chance routers fill;
the lazy hard/cc walk estimates at least the chosen one), hence the
estimated slack SLO - estimate, and, after the run, the measured TTFT and
whether it was on time. It also records the gap to the previous request
routed to the same replica, so misses of requests that followed another
within one step (``STEP_S``) or within the front end's delay can be told
apart from misses at the SLO's edge.

The cell is the sweep's own (``harness.sweep.driver.cell_workload`` and
``SweepSpec.replay_config``), so a diagnosis pairs with a sweep's row for
the same pool, rate, requests, router and seed. The router is the one
``harness.twin.replay.replay`` builds: the diagnosis wraps the registry's
``make_router`` for the duration of the replay rather than rebuilding the
replay here (one replay path, not two that could drift apart).

``latroute study fleet-diagnosis --pool qwen3-h100-x8 --rate 48 --requests 24000 --router sfs-cc
--out DIR [--seed S] [--ties POLICY]`` writes ``DIR/decisions.parquet`` and ``DIR/summary.json``
(``reports.fleet_diagnosis.summarize``); ``latroute study fleet-diagnosis-figure DIR... --out FIG.png`` draws them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd

from reports.fleet_diagnosis import summarize


class RecordingRouter:
    """Delegates to ``inner`` and keeps, per decision, the chosen instance
    and the inner router's estimate of it (NaN when the router keeps none,
    e.g. shortest-queue or the oracle)."""

    def __init__(self, inner, n: int):
        self._inner = inner
        self.chosen = np.full(n, -1, dtype=np.int64)
        self.estimate = np.full(n, np.nan)
        self.p_on_time = np.full(n, np.nan)

    def __getattr__(self, name):  # oracle, blind, mean_decision_us, ...: the inner router's
        return getattr(self._inner, name)

    def __call__(self, i: int, t: float, insts) -> int:
        j = self._inner(i, t, insts)
        self.chosen[i] = int(j)
        lat = getattr(self._inner, "latency", None)
        if lat is not None and 0 <= int(j) < len(lat):
            self.estimate[i] = float(lat[int(j)])
        p = getattr(self._inner, "p", None)
        if p is not None and 0 <= int(j) < len(p):
            self.p_on_time[i] = float(p[int(j)])
        return j


@contextlib.contextmanager
def _recorded(n: int):
    """``harness.twin.replay.make_router`` wrapped so the router it builds is recorded."""
    import harness.twin.replay as replay_mod

    made: list[RecordingRouter] = []
    original = replay_mod.make_router

    def wrapped(*args, **kwargs):
        made.append(RecordingRouter(original(*args, **kwargs), n))
        return made[-1]

    replay_mod.make_router = wrapped
    try:
        yield made
    finally:
        replay_mod.make_router = original


def same_replica_gap(t: np.ndarray, instance: np.ndarray) -> np.ndarray:
    """Seconds since the previous request routed to the same instance (inf for each instance's first)."""
    gap = np.full(t.size, np.inf)
    order = np.lexsort((t, instance))  # by instance, then time
    ti, ii = t[order], instance[order]
    same = np.concatenate(([False], ii[1:] == ii[:-1]))
    g = np.full(t.size, np.inf)
    g[1:] = ti[1:] - ti[:-1]
    gap[order] = np.where(same, g, np.inf)
    return gap


def diagnose(pool: str, rate: float, requests: int, router: str, seed: int = 0, ties: str | None = None,
             noise: bool = True, lengths: str | None = None) -> pd.DataFrame:
    """One decision per row: request_id, arrival_s, instance (index and id), model, slo_s, est_ttft_s,
    est_slack_s, p_on_time, ttft_s, on_time, utility, gap_same_s. ``lengths``: the sweep's predicted-length
    policy (``oracle``: routers told the true output lengths, which says how much of the error at the SLO's
    edge is the residents' unknown lengths)."""
    from harness.sweep.driver import Cell, SweepSpec, cell_workload
    from harness.twin.pools.spec import load_pool
    from harness.twin.replay import replay

    spec = SweepSpec(pool=pool, requests=requests, noise=noise, lengths=lengths)
    cell = Cell(rate=rate, router=router, seed=seed)
    reqs, quality = cell_workload(spec, cell)
    cfg = spec.replay_config(cell)
    if ties is not None:
        if "ties" not in {f.name for f in dataclasses.fields(cfg)}:
            raise ValueError("this checkout's replay has no tie policy (--ties): merge fleet-routers")
        cfg = dataclasses.replace(cfg, ties=ties)
    p = load_pool(pool)
    with _recorded(len(reqs)) as made:
        res = replay(p, pool, reqs, quality, cfg)
    rec = max(made, key=lambda r: int((r.chosen >= 0).sum()))  # replay's router, not warm_up's toy one
    out = res.requests
    ids = [c.instance_id for c in p.instances]
    models = [c.model for c in p.instances]
    t = out["arrival_s"].to_numpy(dtype=np.float64)
    slo = out["slo_ttft_s"].to_numpy(dtype=np.float64)
    est = rec.estimate
    return pd.DataFrame({
        "request_id": out["request_id"].to_numpy(), "arrival_s": t, "instance": rec.chosen,
        "instance_id": np.array(ids, dtype=object)[rec.chosen], "model": np.array(models, dtype=object)[rec.chosen],
        "slo_s": slo, "est_ttft_s": est, "est_slack_s": slo - est, "p_on_time": rec.p_on_time,
        "ttft_s": out["ttft_s"].to_numpy(dtype=np.float64), "on_time": out["on_time"].to_numpy(dtype=bool),
        "utility": out["utility"].to_numpy(dtype=np.float64), "gap_same_s": same_replica_gap(t, rec.chosen),
    })


def run(pool: str, rate: float, requests: int, router: str, seed: int, ties: str | None, noise: bool,
        lengths: str | None, out: Path) -> dict:
    """Diagnose the cell; write ``out/decisions.parquet`` and ``out/summary.json``; the summary."""
    d = diagnose(pool, rate, requests, router, seed, ties, noise=noise, lengths=lengths)
    out.mkdir(parents=True, exist_ok=True)
    d.to_parquet(out / "decisions.parquet", index=False)
    s = summarize(d)
    from harness.twin.pools.spec import load_pool

    s.update({"pool": pool, "rate": rate, "router": router, "seed": seed, "ties": ties,
              "lengths": lengths, "noise": "on" if noise else "off",
              "instance_ids": [c.instance_id for c in load_pool(pool).instances]})
    (out / "summary.json").write_text(json.dumps(s, indent=2, default=float) + "\n")
    return s
