"""``harness.studies.router_shares``: shares of the oracle and of a
reference router, paired over seeds, and cell-time ratios, from cells
written as a sweep writes them."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from harness.studies.fleet_acceptance import load_cells
from harness.studies.router_shares import shares

# per router: OnTimeUtility at (rate 2, rate 4) for seeds 0-2, and each cell's wall seconds
CELLS = {"oracle": ([0.6, 0.5], [0.61, 0.52], [0.59, 0.49], 3.0), "sfs-cc": ([0.6, 0.45], [0.6, 0.5], [0.58, 0.44], 1.0),
         "learned-cc": ([0.5, 0.3], [0.55, 0.35], [0.5, 0.2], 2.0)}


def _sweep(tmp_path, ties=None):
    d = tmp_path / "sw"
    (d / "cells").mkdir(parents=True)
    (d / "sweep.json").write_text(json.dumps({"spec": {"ties": ties} if ties else {}}))
    for router, (*seeds, wall) in CELLS.items():
        for seed, vals in enumerate(seeds):
            for rate, v in zip((2.0, 4.0), vals):
                name = f"{router}-{rate:g}-{seed}"
                pd.DataFrame({"router": [router], "rate": [rate], "seed": [seed], "ontime_utility": [v],
                              "slo_attainment": [v]}).to_parquet(d / "cells" / f"{name}.parquet")
                (d / "cells" / f"{name}.timing.json").write_text(json.dumps({"wall_s": wall}))
    return d


def _auc(vals):
    return (4.0 - 2.0) * (vals[0] + vals[1]) / 2


def test_shares_pair_seeds_and_ratio_cell_times(tmp_path):
    res = shares(load_cells([_sweep(tmp_path)]), "sfs-cc")
    lc = res["routers"]["learned-cc"]
    ratios = [_auc(CELLS["learned-cc"][s]) / _auc(CELLS["oracle"][s]) for s in range(3)]
    assert lc["vs_oracle"]["ratio"]["mean"] == pytest.approx(np.mean(ratios))
    lo, hi = lc["vs_oracle"]["ratio"]["ci95"]
    assert lo < np.mean(ratios) < hi and lc["vs_oracle"]["seeds"] == 3
    assert lc["vs_reference"]["ratio"]["mean"] == pytest.approx(
        np.mean([_auc(CELLS["learned-cc"][s]) / _auc(CELLS["sfs-cc"][s]) for s in range(3)]))
    assert lc["wall_ratio"] == pytest.approx(2.0) and res["routers"]["oracle"]["wall_ratio"] == pytest.approx(3.0)
    assert "vs_reference" not in res["routers"]["sfs-cc"] and "vs_oracle" not in res["routers"]["oracle"]


def test_unknown_reference_is_one_line_exit_2(tmp_path):
    from tests.support.clean_refusal import refused_cleanly

    sweep = _sweep(tmp_path)
    refused_cleanly(["study", "router-shares", sweep, "--reference", "sfs-hard"], [sweep], "--reference",
                    "sfs-hard", "learned-cc")


def test_a_tie_policy_labels_the_routers_it_reaches_not_the_oracle(tmp_path):
    res = shares(load_cells([_sweep(tmp_path, "least-latency")]), "sfs-cc[least-latency]")
    assert sorted(res["routers"]) == ["learned-cc[least-latency]", "oracle", "sfs-cc[least-latency]"]
    assert res["routers"]["sfs-cc[least-latency]"]["vs_oracle"]["seeds"] == 3
