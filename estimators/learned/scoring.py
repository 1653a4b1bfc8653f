"""How ``latroute estimate`` drives the learned estimator over a trace's
queries and what it reports of it: each query becomes a sample (its
features at arrival, its measured TTFT, admitted by the trainer only once
the first token is strictly before a later arrival), and the training's
cost and cold-start share go beside the error figures."""
from __future__ import annotations

import numpy as np
import pandas as pd

from estimators.engine.view import InstanceView, Query
from estimators.evaluate.accuracy import error_summary
from estimators.learned.estimator import LearnedTTFT
from estimators.learned.features import query_features
from estimators.learned.model import LearnedConfig
from estimators.learned.trainer import OnlineTrainer


def teach(est: LearnedTTFT, snap: InstanceView, q: Query, ttft_s: float) -> None:
    """Query ``q`` (on this instance) becomes a sample: its features now,
    its measured TTFT as a label that the trainer admits only once its
    first token (arrival + TTFT) is strictly before a later query's arrival."""
    est.record(snap, q)
    est.observe(q.rid, q.t + ttft_s, ttft_s)


def training_summary(trainers: list[OnlineTrainer], est: pd.DataFrame, cfg: LearnedConfig) -> dict:
    """The learned estimator's training cost and how often the cold start answered."""
    g = est[est["estimator"] == "learned"]
    fits = sum(t.fits for t in trainers)
    wall = sum(t.fit_wall_s for t in trainers)
    out = {**cfg.record(), "models": len(trainers), "fits": fits, "fit_wall_s": wall,
           "mean_fit_ms": 1e3 * wall / fits if fits else None,
           "samples_seen": sum(t.samples_seen for t in trainers),
           "amortised_fit_us_per_estimate": 1e6 * wall / len(g) if len(g) else None,
           "cold_start_share": float((g["source"] == "cold-start").mean()) if len(g) else None}
    by = {}
    for src, h in g.groupby("source", sort=True):
        e = error_summary(h["est_s"].to_numpy(), h["true_s"].to_numpy())
        by[str(src)] = {k: e.get(k) for k in ("n", "mape", "median_ape", "p90_ape")}
    out["by_source"] = by
    return out


def pretrained(trace, cfg: LearnedConfig) -> dict[str, OnlineTrainer]:
    """Per instance of ``trace`` (a recording with measured TTFTs), a
    trainer fed all of its requests and fitted once: the model a
    deployment would carry into another run or host (``estimate
    --train-on``). Its samples keep their order but are shifted before
    time 0, so on the next trace they are all in the past, and the newest
    ``window`` of them stay in the window until that trace's own samples
    displace them."""
    from estimators.snapshot import RecordedWalk

    reqs = trace.read("requests")
    ttft = reqs["ttft_s"].to_numpy(dtype=np.float64)
    first = reqs["arrival_s"].to_numpy(dtype=np.float64) + ttft
    shift = float(np.nanmax(first)) + 1.0 if np.isfinite(first).any() else 0.0
    out = {}
    for inst in trace.read("instances")["instance_id"].astype(str):
        tr = OnlineTrainer(cfg)
        walk = RecordedWalk(trace, inst, reqs)
        for idx, snap in walk.queries():
            q = Query(idx, snap.t, int(walk.prompt[idx]))
            key = -1 - idx  # never a request of the trace it is carried into
            tr.record(key, query_features(snap, q))
            tr.label(key, first[idx] - shift, ttft[idx])
        tr.advance(-0.5)
        out[inst] = tr
    return out


def carried(models: dict[str, OnlineTrainer], inst: str) -> OnlineTrainer | None:
    """The pretrained trainer for instance ``inst``: the one of that id, or the only one."""
    if inst in models:
        return models[inst]
    return next(iter(models.values())) if len(models) == 1 else None
