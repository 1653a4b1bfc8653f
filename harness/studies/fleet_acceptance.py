"""The fleet acceptance table (issue 26) from several sweeps of one pool.

Why several: a sweep has one request count per cell, and a fleet cell must
simulate >= 500 s at every rate, so each rate is its own sweep with
requests = rate x 500; and a sweep has one tie policy, so each policy is
another. The cells pair across sweeps (the workload seed comes from the
cell's seed and rate, the twin's from its seed: ``harness.sweep.driver``),
so the paired intervals are those ``latroute sweep`` would print had it run
them together. A router run under a tie policy other than lowest-index is
labelled ``router[ties]``.

Per router: the OnTimeUtility AUC over the rates (trapezoid,
``harness.sweep.driver.auc``) for each seed and its mean with a 95%
interval (``reports.paired_stats``); the share of the oracle's AUC on the
seeds the oracle ran (when it ran fewer than the others, on those only,
said in the output); and the best SFS router against every non-SFS router,
paired over the seeds all of them ran.

``python -m harness.studies.fleet_acceptance SWEEP_DIR... [--json OUT.json]`` prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from harness.sweep.driver import auc
from reports.paired_stats import mean_ci, paired

DEFAULT_TIES = "lowest-index"


def load_cells(dirs: list[Path]) -> pd.DataFrame:
    """Every cell of the sweeps, labelled by router and tie policy, with its wall seconds."""
    frames = []
    for d in dirs:
        d = Path(d)
        df = pd.read_parquet(d / "results.parquet")
        meta = json.loads((d / "metrics.json").read_text())
        ties = meta.get("ties") or DEFAULT_TIES
        df["ties"] = ties
        df["label"] = df["router"] if ties == DEFAULT_TIES else df["router"] + f"[{ties}]"
        timings = d / "timings.parquet"
        if timings.is_file():
            t = pd.read_parquet(timings)
            if "wall_s" in t and len(t) == len(df):
                df["wall_s"] = t["wall_s"].to_numpy()
        df["sweep"] = d.name
        frames.append(df)
    cells = pd.concat(frames, ignore_index=True)
    dup = cells.duplicated(["label", "rate", "seed"])
    if dup.any():
        r = cells[dup].iloc[0]
        raise ValueError(f"{r['sweep']}: cell {r['label']} at {r['rate']:g} q/s seed {r['seed']} is in two sweeps")
    return cells


def seed_aucs(cells: pd.DataFrame, rates: list[float]) -> dict[str, pd.Series]:
    """Per label, its AUC per seed over ``rates`` (seeds that ran every rate)."""
    out = {}
    for label, g in cells[cells["rate"].isin(rates)].groupby("label"):
        per = {}
        for seed, s in g.groupby("seed"):
            if len(s) == len(rates):
                per[int(seed)] = auc(s["rate"].to_numpy(dtype=float), s["ontime_utility"].to_numpy(dtype=float))
        out[label] = pd.Series(per).sort_index()
    return out


def is_sfs(label: str) -> bool:
    return label.startswith("sfs-")


def acceptance(cells: pd.DataFrame) -> dict:
    rates = sorted(float(r) for r in cells["rate"].unique())
    per = seed_aucs(cells, rates)
    res: dict = {"rates": rates, "routers": {}}
    oracle = per.get("oracle")
    for label, s in per.items():
        row = {"auc": mean_ci(s.to_numpy()), "seeds": [int(k) for k in s.index]}
        if oracle is not None and len(oracle) and label != "oracle":
            common = s.index.intersection(oracle.index)
            if len(common):
                row["oracle_share"] = float(s[common].mean() / oracle[common].mean())
                row["oracle_share_seeds"] = [int(k) for k in common]
        res["routers"][label] = row
    honest = [k for k in per if k != "oracle"]
    sfs = [k for k in honest if is_sfs(k)]
    if sfs:
        best = max(sfs, key=lambda k: per[k].mean())
        res["best_sfs"] = best
        res["best_sfs_vs"] = {}
        for other in (k for k in honest if not is_sfs(k)):
            common = per[best].index.intersection(per[other].index)
            res["best_sfs_vs"][other] = {"seeds": len(common),
                                         **paired(per[best][common].to_numpy(), per[other][common].to_numpy())}
    by_rate = cells.groupby(["label", "rate"]).agg(ontime_utility=("ontime_utility", "mean"),
                                                   slo_attainment=("slo_attainment", "mean"),
                                                   seeds=("seed", "nunique"))
    res["by_rate"] = {f"{lab}@{r:g}": v for (lab, r), v in by_rate.to_dict("index").items()}
    if "wall_s" in cells:
        w = cells.groupby(["label", "rate"])["wall_s"].mean()
        res["wall_s_per_cell"] = {f"{lab}@{r:g}": float(v) for (lab, r), v in w.items()}
    return res


def _ci(c: dict | None, fmt: str = "{:+.3f}") -> str:
    if c is None or c.get("ci95") is None:
        return "—"
    lo, hi = c["ci95"]
    return f"[{fmt.format(lo)}, {fmt.format(hi)}]"


def markdown(res: dict) -> str:
    rates = ", ".join(f"{r:g}" for r in res["rates"])
    lines = [f"rates {rates} q/s", "",
             "| router | OnTimeUtility AUC (mean over seeds, 95% CI) | seeds | share of the oracle (seeds) |",
             "|---|---|---|---|"]
    order = sorted(res["routers"], key=lambda k: -res["routers"][k]["auc"]["mean"])
    for k in order:
        v = res["routers"][k]
        share = f"{100 * v['oracle_share']:.1f}% ({','.join(map(str, v['oracle_share_seeds']))})" \
            if "oracle_share" in v else ("100%" if k == "oracle" else "—")
        lines.append(f"| {k} | {v['auc']['mean']:.3f} {_ci(v['auc'], '{:.3f}')} | {len(v['seeds'])} | {share} |")
    if "best_sfs" in res:
        lines += ["", f"best SFS router: {res['best_sfs']}; paired over seeds, AUC difference (95% CI) and ratio:", "",
                  "| vs | difference | ratio | seeds |", "|---|---|---|---|"]
        for other, p in res["best_sfs_vs"].items():
            d, r = p["difference"], p["ratio"]
            lines.append(f"| {other} | {d['mean']:+.3f} {_ci(d)} | {r['mean']:.3f} {_ci(r, '{:.3f}')} | "
                         f"{p['seeds']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.studies.fleet_acceptance", description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="also write the numbers as JSON")
    a = ap.parse_args(argv)
    res = acceptance(load_cells(a.sweeps))
    print(markdown(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
