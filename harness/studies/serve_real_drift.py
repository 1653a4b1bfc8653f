"""Why ``serve`` cannot reliably beat a second real run on this machine
(docs/results/serve-faithfulness.md, "What limits the real-engine
target"): reads the directories ``latroute study serve-real``
wrote and measures, per real run, how its steps' durations drift.

For each repetition OUT (its profile ``OUT/tiny-a.json``, fitted on real1)
and each recorded real run in it:

- the steps' actual / typical duration (the profile's linear model): mean,
  median, and the autocorrelation of its logarithm at lags of 1, 5, 20 and
  100 steps: a slow or fast spell of the engine lasts many steps, so a
  request's TTFT (one to a few steps) carries the spell's speed, which no
  deterministic emulation can know;
- the hand-over from the API process to the scheduler (``added_s -
  arrival_s``): its mean, its correlation with the in-flight step's
  remaining time at arrival (the twin's intake rule: a request waits for
  the step in flight), and between the two held-out runs request by request;
- per-request engine TTFT MAPE between the held-out runs, and the same
  with the hand-over taken out.

``latroute study serve-real-drift OUT [OUT ...]`` (prints markdown tables).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

RUNS = ("real0", "real1", "real2", "real3")  # real0 (the warm-up run) where the repetition has one
LAGS = (1, 5, 20, 100)


def step_ratios(rep: Path, run: str) -> np.ndarray:
    from estimators.timemodel.profile import load_profile

    return ratios(load_profile(rep / "tiny-a.json"), rep / run / "rec.t")


def ratios(prof, rec: Path) -> np.ndarray:
    """A recording's steps, in order: actual duration / the profile's typical one."""
    s = pd.read_parquet(rec / "steps.parquet").sort_values("start_s")
    return ((s["end_s"] - s["start_s"]).to_numpy() / prof.typical(s))


def autocorr(x: np.ndarray, lag: int) -> float:
    x = x - x.mean()
    return float(np.corrcoef(x[:-lag], x[lag:])[0, 1])


def handover(rep: Path, run: str) -> pd.DataFrame:
    """Per recorded request: hand-over (s) and the in-flight step's remaining time at arrival (0: idle)."""
    q = pd.read_parquet(rep / run / "rec.t" / "requests.parquet")
    s = pd.read_parquet(rep / run / "rec.t" / "steps.parquet").sort_values("start_s")
    st, en = s["start_s"].to_numpy(), s["end_s"].to_numpy()
    a = q["arrival_s"].to_numpy()
    i = np.searchsorted(st, a, side="right") - 1
    rem = np.where((i >= 0) & (en[np.maximum(i, 0)] > a), en[np.maximum(i, 0)] - a, 0.0)
    return pd.DataFrame({"request_id": q["request_id"], "handover": q["added_s"] - q["arrival_s"], "remaining": rem})


def held_out(rep: Path) -> dict:
    """real3 vs real2, request by request (joined by the client's id)."""
    j = {r: pd.read_parquet(rep / r / "join" / "join.parquet").set_index("client_id") for r in ("real2", "real3")}
    h = {r: handover(rep, r).set_index("request_id")["handover"] for r in ("real2", "real3")}
    ids = j["real2"].index.intersection(j["real3"].index)
    e = {r: j[r].loc[ids, "engine_ttft_s"].to_numpy() for r in j}
    ho = {r: h[r].loc[j[r].loc[ids, "recording_request_id"].to_numpy()].to_numpy() for r in j}
    after = {r: e[r] - ho[r] for r in e}
    return {"engine_mape": float(np.mean(np.abs(e["real3"] - e["real2"]) / e["real2"]) * 100),
            "after_handover_mape": float(np.mean(np.abs(after["real3"] - after["real2"]) / after["real2"]) * 100),
            "handover_corr": float(np.corrcoef(ho["real2"], ho["real3"])[0, 1])}


def study(reps: list[Path]) -> None:
    print("| repetition | run | steps | actual / typical: mean, median | autocorrelation at lag "
          + ", ".join(map(str, LAGS)) + " | hand-over mean / median (ms) | corr(hand-over, in-flight remaining) |")
    print("|---|---|---|---|---|---|---|")
    for rep in reps:
        for run in (r for r in RUNS if (rep / r / "rec.t").is_dir()):
            r = step_ratios(rep, run)
            lr = np.log(r)
            h = handover(rep, run)
            print(f"| {rep.name} | {run} | {len(r):,} | {r.mean():.3f}, {np.median(r):.3f} | "
                  + ", ".join(f"{autocorr(lr, k):.2f}" for k in LAGS)
                  + f" | {h['handover'].mean() * 1e3:.1f} / {h['handover'].median() * 1e3:.1f}"
                  + f" | {np.corrcoef(h['handover'], h['remaining'])[0, 1]:.2f} |")
    print()
    print("| repetition | engine TTFT MAPE real3 vs real2 | the same, hand-over taken out | corr(hand-over real2, real3) |")
    print("|---|---|---|---|")
    for rep in reps:
        d = held_out(rep)
        print(f"| {rep.name} | {d['engine_mape']:.2f}% | {d['after_handover_mape']:.2f}% | {d['handover_corr']:.2f} |")
