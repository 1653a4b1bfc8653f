"""Routers against the oracle and a reference router, paired over seeds,
with what their cells cost: the table of issue 28's routing sweeps.

Why another table than ``harness.studies.fleet_acceptance``: that one
answers the fleet issue's question (the best *SFS* router against every
non-SFS router). Comparing learned routers with SFS needs each router's
share of the oracle *with its paired interval* and its ratio to a named
reference (``--reference``, e.g. ``sfs-cc``), and, since the learned
routers' retraining is paid in simulated-time fits, each router's cell
wall time as a multiple of the reference's in the same sweeps (one run,
one machine: a ratio, not an absolute figure).

Cells are read with ``fleet_acceptance.load_cells`` (finished cells of one
or several sweeps of one pool, labelled ``router[ties]`` when a sweep used
a tie policy other than lowest-index), so a sweep per rate pairs as one.

``python -m harness.studies.router_shares SWEEP_DIR... --reference LABEL`` prints a Markdown table.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from harness.studies.fleet_acceptance import load_cells, seed_aucs
from harness.studies.study_args import StudyParser, run_study
from reports.paired_stats import mean_ci, paired_on_common


def shares(cells: pd.DataFrame, reference: str) -> dict:
    """Per label: AUC over seeds (95% CI), its ratio to the oracle and to
    ``reference`` paired over the seeds both ran, and the summed cell
    wall time over the reference's (rates and seeds both ran)."""
    rates = sorted(float(r) for r in cells["rate"].unique())
    per = seed_aucs(cells, rates)
    if reference not in per:
        raise ValueError(f"no router labelled {reference!r} in the sweeps (labels: {', '.join(sorted(per))})")
    wall = cells.set_index(["label", "rate", "seed"])["wall_s"]
    out: dict = {"rates": rates, "reference": reference, "routers": {}}
    for label, s in per.items():
        row: dict = {"auc": mean_ci(s.to_numpy()), "seeds": [int(k) for k in s.index]}
        for key, other in (("vs_oracle", "oracle"), ("vs_reference", reference)):
            if other in per and label != other:
                row[key] = paired_on_common(s, per[other])
        both = wall.loc[label].index.intersection(wall.loc[reference].index)
        ref_s = float(wall.loc[reference].loc[both].sum())
        row["wall_ratio"] = float(wall.loc[label].loc[both].sum()) / ref_s if ref_s > 0 else None
        out["routers"][label] = row
    return out


def _ratio(p: dict | None) -> str:
    if not p:
        return "—"
    r = p["ratio"]
    ci = r.get("ci95")
    return f"{100 * r['mean']:.1f}%" + (f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]" if ci else "")


def markdown(res: dict) -> str:
    ref = res["reference"]
    lines = [f"rates {', '.join(f'{r:g}' for r in res['rates'])} q/s", "",
             f"| router | OnTimeUtility AUC [95% CI] | share of the oracle [paired 95% CI] | of {ref} "
             f"[paired 95% CI] | cell time / {ref}'s |", "|---|---|---|---|---|"]
    for k in sorted(res["routers"], key=lambda k: -res["routers"][k]["auc"]["mean"]):
        v = res["routers"][k]
        a = v["auc"]
        ci = f" [{a['ci95'][0]:.3f}, {a['ci95'][1]:.3f}]" if a.get("ci95") else ""
        share = "100%" if k == "oracle" else _ratio(v.get("vs_oracle"))
        vs = "1" if k == ref else _ratio(v.get("vs_reference"))
        w = f"{v['wall_ratio']:.2f}x" if v.get("wall_ratio") is not None else "—"
        lines.append(f"| {k} | {a['mean']:.3f}{ci} | {share} | {vs} | {w} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = StudyParser(prog=PROG, description=__doc__.split("\n")[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--reference", default="sfs-cc", help="label the others are compared with (default sfs-cc)")
    a = ap.parse_args(argv)
    try:
        res = shares(load_cells(a.sweeps), a.reference)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {PROG}: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(markdown(res))
    return 0


PROG = "python -m harness.studies.router_shares"

if __name__ == "__main__":  # pragma: no cover
    sys.exit(run_study(main, PROG))
