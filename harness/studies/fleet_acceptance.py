"""The fleet acceptance table (issue 26) from several sweeps of one pool.

Why several: a sweep has one request count per cell, and a fleet cell must
simulate >= 500 s at every rate, so each rate is its own sweep with
requests = rate x 500; and a sweep has one tie policy, so each policy is
another. The cells pair across sweeps (the workload seed comes from the
cell's seed and rate, the twin's from its seed: ``harness.sweep.driver``),
so the paired intervals are those ``latroute sweep`` would print had it run
them together. A router run under a tie policy other than lowest-index is
labelled ``router[ties]``, except the oracle, which no tie policy reaches;
a learned router refitted at another interval than llm-d's 1 s is
labelled ``router[ties]@Ns``.

Per router: the OnTimeUtility AUC over the rates (trapezoid,
``harness.sweep.driver.auc``) for each seed and its mean with a 95%
interval (``reports.paired_stats``); the share of the oracle's AUC on the
seeds the oracle ran (when it ran fewer than the others, on those only,
said in the output); and the best SFS router against every non-SFS router,
paired over the seeds all of them ran.

``python -m harness.studies.fleet_acceptance SWEEP_DIR... [--json OUT.json]`` prints a Markdown table.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

from estimators.learned.model import RETRAIN_EVERY_S
from harness.studies.study_args import StudyParser, run_study
from harness.sweep.driver import auc
from reports.paired_stats import mean_ci, paired_on_common
from routers.registry import router_entry

DEFAULT_TIES = "lowest-index"


def load_cells(dirs: list[Path]) -> pd.DataFrame:
    """Every finished cell of the sweeps (``cells/``, so a sweep still
    running or stopped counts with the cells it finished), labelled by
    router and tie policy (the sweep's ``sweep.json``), with its wall seconds."""
    frames = []
    for d in dirs:
        d = Path(d)
        spec = json.loads((d / "sweep.json").read_text()).get("spec", {})
        ties = spec.get("ties") or DEFAULT_TIES
        parts = sorted(p for p in (d / "cells").glob("*.parquet") if not p.name.startswith("."))
        if not parts:
            continue
        df = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
        df["wall_s"] = [json.loads(p.with_name(p.name[: -len(".parquet")] + ".timing.json").read_text())["wall_s"]
                        for p in parts]
        df["ties"] = ties
        # the oracle picks by forking every instance's future: no tie policy reaches it, so it keeps its name
        tied = (df["router"] != "oracle") & (ties != DEFAULT_TIES)
        df["label"] = df["router"].where(~tied, df["router"] + f"[{ties}]")
        every = spec.get("retrain_every_s", RETRAIN_EVERY_S)
        if every != RETRAIN_EVERY_S:  # learned routers' refit interval, when not llm-d's 1 s: sweeps differ by it
            df["label"] = df["label"].where(~df["router"].map(_learned), df["label"] + f"@{every:g}s")
        df["sweep"] = d.name
        frames.append(df)
    if not frames:
        raise ValueError("no finished cells in " + ", ".join(str(d) for d in dirs))
    cells = pd.concat(frames, ignore_index=True)
    dup = cells.duplicated(["label", "rate", "seed"])
    if dup.any():
        r = cells[dup].iloc[0]
        raise ValueError(f"{r['sweep']}: cell {r['label']} at {r['rate']:g} q/s seed {r['seed']} is in two sweeps")
    return cells


def _learned(router: str) -> bool:
    try:
        return router_entry(router).estimator == "learned"
    except (KeyError, ValueError):
        return False


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


def _oracle_share(s: pd.Series, oracle: pd.Series) -> dict:
    """The ratio of mean scores to the oracle's on the seeds both ran (an
    unpaired share: the oracle often runs on fewer seeds), or nothing."""
    common = s.index.intersection(oracle.index)
    if not len(common):
        return {}
    return {"oracle_share": float(s[common].mean() / oracle[common].mean()),
            "oracle_share_seeds": [int(k) for k in common]}


def acceptance(cells: pd.DataFrame) -> dict:
    rates = sorted(float(r) for r in cells["rate"].unique())
    per = seed_aucs(cells, rates)
    res: dict = {"rates": rates, "routers": {}}
    oracle = per.get("oracle")
    for label, s in per.items():
        row = {"auc": mean_ci(s.to_numpy()), "seeds": [int(k) for k in s.index]}
        if oracle is not None and label != "oracle":
            row.update(_oracle_share(s, oracle))
        res["routers"][label] = row
    honest = [k for k in per if k != "oracle"]
    sfs = [k for k in honest if is_sfs(k)]
    if sfs:
        best = max(sfs, key=lambda k: per[k].mean())
        res["best_sfs"] = best
        res["best_sfs_vs"] = {}
        for other in (k for k in honest if not is_sfs(k)):
            res["best_sfs_vs"][other] = paired_on_common(per[best], per[other])
    res["by_rate"] = per_rate(cells)
    if "wall_s" in cells:
        w = cells.groupby(["label", "rate"])["wall_s"].mean()
        res["wall_s_per_cell"] = {f"{lab}@{r:g}": float(v) for (lab, r), v in w.items()}
    return res


def per_rate(cells: pd.DataFrame) -> dict:
    """Per rate and label: OnTimeUtility and SLO attainment over seeds (95%
    CI), the share of the oracle on the seeds both ran, and the seeds."""
    out: dict = {}
    for rate, g in cells.groupby("rate"):
        ser = {lab: s.set_index("seed")["ontime_utility"].sort_index() for lab, s in g.groupby("label")}
        slo = {lab: s["slo_attainment"].mean() for lab, s in g.groupby("label")}
        oracle = ser.get("oracle")
        row = {}
        for lab, s in ser.items():
            v = {"ontime_utility": mean_ci(s.to_numpy()), "slo_attainment": float(slo[lab]),
                 "seeds": [int(k) for k in s.index]}
            if oracle is not None and lab != "oracle":
                v.update(_oracle_share(s, oracle))
            row[lab] = v
        sfs = [k for k in ser if is_sfs(k)]
        if sfs:
            best = max(sfs, key=lambda k: ser[k].mean())
            for other in (k for k in ser if k != "oracle" and not is_sfs(k)):
                row[best].setdefault("vs", {})[other] = paired_on_common(ser[best], ser[other])
        out[f"{rate:g}"] = row
    return out


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
    lines += ["", "per rate: OnTimeUtility mean over seeds [95% CI] (seeds); SLO met; share of the oracle (its seeds)",
              "", "| rate | router | OnTimeUtility | SLO met | share of the oracle |", "|---|---|---|---|---|"]
    for rate, row in res["by_rate"].items():
        for k in sorted(row, key=lambda k: -row[k]["ontime_utility"]["mean"]):
            v = row[k]
            share = f"{100 * v['oracle_share']:.1f}% ({','.join(map(str, v['oracle_share_seeds']))})" \
                if "oracle_share" in v else "—"
            lines.append(f"| {rate} | {k} | {v['ontime_utility']['mean']:.4f} {_ci(v['ontime_utility'], '{:.4f}')} "
                         f"({','.join(map(str, v['seeds']))}) | {100 * v['slo_attainment']:.1f}% | {share} |")
    lines += ["", "per rate, the best SFS router there vs each non-SFS router: OnTimeUtility difference, paired "
              "[95% CI] (seeds)", "", "| rate | best SFS | vs | difference |", "|---|---|---|---|"]
    for rate, row in res["by_rate"].items():
        for k, v in row.items():
            for other, p in v.get("vs", {}).items():
                d = p["difference"]
                lines.append(f"| {rate} | {k} | {other} | {d['mean']:+.4f} {_ci(d, '{:+.4f}')} ({p['seeds']}) |")
    if "best_sfs" in res:
        lines += ["", f"best SFS router: {res['best_sfs']}; paired over seeds, AUC difference (95% CI) and ratio:", "",
                  "| vs | difference | ratio | seeds |", "|---|---|---|---|"]
        for other, p in res["best_sfs_vs"].items():
            d, r = p["difference"], p["ratio"]
            lines.append(f"| {other} | {d['mean']:+.3f} {_ci(d)} | {r['mean']:.3f} {_ci(r, '{:.3f}')} | "
                         f"{p['seeds']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = StudyParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="also write the numbers as JSON")
    a = ap.parse_args(argv)
    res = acceptance(load_cells(a.sweeps))
    print(markdown(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2, default=float) + "\n")
    return 0


PROG = "python -m harness.studies.fleet_acceptance"

if __name__ == "__main__":
    sys.exit(run_study(main, PROG))
