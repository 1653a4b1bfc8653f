"""The fleet diagnosis's summary and figure: where a router's
SLO misses on a replica pool come from.

Input: the per-decision tables ``harness.studies.fleet_diagnosis`` writes
(``decisions.parquet``: the replica chosen, the router's estimated TTFT of
it and so the estimated slack SLO - estimate, the measured TTFT, on time,
and the gap to the previous request sent to the same replica). One figure,
four panels, one line or bar series per run (e.g. per tie policy):

1. requests per replica, instances in pool order (lowest-index fills
   replica 0 of a model first);
2. the share of requests by estimated slack, and the miss rate there: a calibrated router at epsilon 0.1
   would miss at most ~10% wherever it admitted a request, so a miss rate
   far above that at small slack is estimation error at the SLO's edge,
   and the share of requests there says how often the policy goes to the
   edge;
3. misses of requests that followed another to the same replica within
   the front end's delay (5 ms) or within one step (~7.5 ms), against the
   rest: if close successors missed far more often, the cause would be
   decisions not seeing each other.

``latroute study fleet-diagnosis-figure DIR [DIR ...] --out FIG.png [--labels a,b,c]``
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from reports.colours import PALETTE

# one decode step of the replica pools' instances at the paper's load (~7.5 ms)
STEP_S = 0.0075
FRONTEND_S = 0.005
SLACK_EDGES_S = (-np.inf, 0.0, 0.025, 0.05, 0.1, 0.2, 0.5, np.inf)


def _slack_label(lo: float, hi: float) -> str:
    if not np.isfinite(lo):
        return f"<{hi * 1e3:g}"
    if not np.isfinite(hi):
        return f">{lo * 1e3:g}"
    return f"{lo * 1e3:g}-{hi * 1e3:g}"


def gap_groups(gap: np.ndarray, frontend_s: float = FRONTEND_S, step_s: float = STEP_S) -> dict[str, np.ndarray]:
    """Disjoint groups by the gap to the previous request on the same replica."""
    return {f"< {frontend_s * 1e3:g} ms": gap < frontend_s,
            f"{frontend_s * 1e3:g}-{step_s * 1e3:g} ms": (gap >= frontend_s) & (gap < step_s),
            f">= {step_s * 1e3:g} ms": gap >= step_s}


def summarize(d: pd.DataFrame, frontend_s: float = FRONTEND_S, step_s: float = STEP_S) -> dict:
    """Per-replica load, misses by estimated slack, misses after a close same-replica predecessor."""
    miss = ~d["on_time"].to_numpy(dtype=bool)
    out: dict = {"requests": len(d), "ontime_utility": float((d["utility"] * d["on_time"]).mean()),
                 "slo_attainment": float(d["on_time"].mean())}
    out["per_instance"] = {str(k): {"requests": int(len(g)), "miss_rate": float((~g["on_time"]).mean())}
                           for k, g in d.groupby("instance_id", sort=False)}
    slack = d["est_slack_s"].to_numpy(dtype=np.float64)
    bins = []
    for lo, hi in zip(SLACK_EDGES_S[:-1], SLACK_EDGES_S[1:]):
        m = (slack >= lo) & (slack < hi)
        bins.append({"slack_ms": _slack_label(lo, hi), "requests": int(m.sum()), "misses": int(miss[m].sum()),
                     "miss_rate": float(miss[m].mean()) if m.any() else None})
    out["by_est_slack"] = bins
    out["no_estimate"] = {"requests": int(np.isnan(slack).sum()), "misses": int(miss[np.isnan(slack)].sum())}
    gap = d["gap_same_s"].to_numpy(dtype=np.float64)
    out["by_same_replica_gap"] = {k: {"requests": int(m.sum()), "misses": int(miss[m].sum()),
                                      "miss_rate": float(miss[m].mean()) if m.any() else None,
                                      "share_of_misses": float(miss[m].sum() / max(1, miss.sum()))}
                                  for k, m in gap_groups(gap, frontend_s, step_s).items()}
    return out


def figure(runs: dict[str, pd.DataFrame], instance_ids: list[str], out: Path, title: str = "") -> Path:
    """The four-panel figure of ``runs`` (label -> decisions), PNG at ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.8), gridspec_kw={"width_ratios": [2.2, 1.0, 1.0, 0.9]})
    k = len(runs)
    width = 0.8 / max(1, k)
    labels: list[str] = []
    for n, (label, d) in enumerate(runs.items()):
        colour = PALETTE[n % len(PALETTE)]
        shift = (n - (k - 1) / 2) * width
        counts = d["instance_id"].value_counts()
        axes[0].bar(np.arange(len(instance_ids)) + shift, [int(counts.get(i, 0)) for i in instance_ids], width,
                    color=colour, label=f"{label} (SLO met {100 * d['on_time'].mean():.1f}%)")
        s = summarize(d)
        bins = s["by_est_slack"]
        labels = [b["slack_ms"] for b in bins]
        axes[1].bar(np.arange(len(bins)) + shift, [100 * b["requests"] / max(1, s["requests"]) for b in bins], width,
                    color=colour, label=label)
        axes[2].plot(range(len(bins)), [np.nan if b["miss_rate"] is None else b["miss_rate"] for b in bins],
                     marker="o", color=colour, label=label)
        groups = s["by_same_replica_gap"]
        axes[3].bar(np.arange(len(groups)) + shift, [np.nan if g["miss_rate"] is None else g["miss_rate"]
                                                     for g in groups.values()], width, color=colour, label=label)
    axes[0].set_xticks(range(len(instance_ids)), instance_ids, rotation=90, fontsize=6)
    axes[0].set_ylabel("requests routed")
    axes[0].set_title("requests per replica (pool order)")
    axes[0].legend(fontsize=7)
    for ax in axes[1:3]:
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlabel("estimated slack, SLO - estimate (ms)")
    axes[1].set_ylabel("% of requests")
    axes[1].set_title("where the router admits requests")
    axes[2].set_ylabel("SLO miss rate")
    axes[2].set_title("misses by estimated slack")
    axes[2].set_ylim(0, 1)
    axes[2].legend(fontsize=7)
    gl = list(gap_groups(np.zeros(0)).keys())
    axes[3].set_xticks(range(len(gl)), gl, fontsize=7)
    axes[3].set_xlabel("gap to the previous request, same replica")
    axes[3].set_ylabel("SLO miss rate")
    axes[3].set_title("misses after a close same-replica request", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def load_run(path: Path) -> tuple[pd.DataFrame, dict]:
    d = pd.read_parquet(Path(path) / "decisions.parquet")
    meta = json.loads((Path(path) / "summary.json").read_text())
    return d, meta


def draw(runs: list[Path], labels: list[str] | None, out: Path) -> None:
    """One figure of the runs ``harness.studies.fleet_diagnosis`` wrote, labelled ``labels`` (default: each
    run's tie policy)."""
    loaded = [load_run(p) for p in runs]
    labels = labels or [m.get("ties") or m.get("router", p.name) for p, (_, m) in zip(runs, loaded)]
    first = loaded[0][1]
    ids = first["instance_ids"]
    title = (f"{first['router']} on {first['pool']}, {first['rate']:g} q/s, {first['requests']:,} requests, "
             f"seed {first['seed']}")
    figure({lab: d for lab, (d, _) in zip(labels, loaded)}, ids, out, title)
