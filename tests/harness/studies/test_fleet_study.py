"""The fleet diagnosis: per-decision records of a replica-pool
replay, their summary and figure."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.studies.fleet_diagnosis import RecordingRouter, diagnose, same_replica_gap
from reports.fleet_diagnosis import figure, gap_groups, summarize


def test_same_replica_gap():
    t = np.array([0.0, 0.001, 0.002, 0.010, 0.011])
    inst = np.array([0, 1, 0, 0, 1])
    gap = same_replica_gap(t, inst)
    assert np.isinf(gap[0]) and np.isinf(gap[1])
    assert gap[2] == pytest.approx(0.002) and gap[3] == pytest.approx(0.008) and gap[4] == pytest.approx(0.010)


class _Fake:
    oracle = False
    mean_decision_us = 1.5

    def __init__(self):
        self.latency = np.array([0.3, 0.1, np.inf])

    def __call__(self, i, t, insts):
        return 1 if i % 2 else 0


def test_recording_router_delegates_and_records():
    r = RecordingRouter(_Fake(), 3)
    assert r(0, 0.0, None) == 0 and r(1, 0.1, None) == 1
    assert r.oracle is False and r.mean_decision_us == 1.5
    assert list(r.chosen) == [0, 1, -1]
    assert r.estimate[0] == 0.3 and r.estimate[1] == 0.1 and np.isnan(r.estimate[2])
    assert np.isnan(r.p_on_time).all()  # the fake keeps no P(on time)


def _decisions(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    t = np.sort(rng.random(n) * 10)
    inst = rng.integers(0, 4, n)
    slack = rng.normal(0.1, 0.1, n)
    return pd.DataFrame({"arrival_s": t, "instance": inst, "instance_id": [f"m-r{j}" for j in inst],
                         "est_slack_s": slack, "on_time": slack + rng.normal(0, 0.05, n) > 0,
                         "utility": rng.random(n), "gap_same_s": same_replica_gap(t, inst)})


def test_summary_partitions_every_decision():
    d = _decisions()
    s = summarize(d)
    assert sum(b["requests"] for b in s["by_est_slack"]) == len(d)
    assert sum(g["requests"] for g in s["by_same_replica_gap"].values()) == len(d)
    assert sum(b["misses"] for b in s["by_est_slack"]) == int((~d["on_time"]).sum())
    assert sum(v["requests"] for v in s["per_instance"].values()) == len(d)
    # the synthetic truth misses mostly at negative slack: the summary must show it
    neg = s["by_est_slack"][0]
    assert neg["slack_ms"] == "<0" and neg["miss_rate"] > 0.5 > s["by_est_slack"][-2]["miss_rate"]
    groups = gap_groups(d["gap_same_s"].to_numpy())
    assert sum(m.astype(int) for m in groups.values()).max() == 1  # disjoint


def test_figure_is_written(tmp_path):
    out = figure({"a": _decisions(), "b": _decisions(seed=1)}, [f"m-r{j}" for j in range(4)], tmp_path / "f.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_diagnosis_is_the_sweep_cell():
    """The diagnosis replays the sweep's cell: its on-time utility is the
    sweep row's, its instances are the replay's, and sfs-cc's estimate of
    the chosen replica is always known (its walk estimates it)."""
    from harness.sweep.driver import Cell, SweepSpec, run_cell

    d = diagnose("qwen3-h100-x8", 48.0, 300, "sfs-cc", seed=1)
    row, _ = run_cell(SweepSpec(pool="qwen3-h100-x8", requests=300), Cell(rate=48.0, router="sfs-cc", seed=1))
    assert s_otu(d) == pytest.approx(row["ontime_utility"], abs=1e-12)
    assert (d["instance"] >= 0).all() and np.isfinite(d["est_ttft_s"]).all()
    assert d["model"].nunique() >= 2
    shares = d["instance_id"].value_counts(normalize=True)
    for inst, share in shares.items():
        assert share == pytest.approx(row[f"share_{inst}"])


def s_otu(d: pd.DataFrame) -> float:
    return summarize(d)["ontime_utility"]


def _sweep_dir(root, name, ties, rows):
    import json

    d = root / name
    (d / "cells").mkdir(parents=True)
    for k, row in enumerate(rows):
        pd.DataFrame([row]).to_parquet(d / "cells" / f"{k:020x}.parquet")
        (d / "cells" / f"{k:020x}.timing.json").write_text(json.dumps({"wall_s": 1.0 + k}))
    (d / "sweep.json").write_text(json.dumps({"spec": {"ties": ties} if ties else {}, "cells": []}))
    return d


def test_acceptance_pairs_cells_across_sweeps(tmp_path):
    """Per-rate sweeps and a tie-policy sweep combine into one AUC per
    router and seed; the oracle share uses only the seeds the oracle ran."""
    from harness.studies.fleet_acceptance import acceptance, load_cells, markdown

    def rows(router, rates, seeds, f):
        return [{"router": router, "rate": r, "seed": s, "ontime_utility": f(r, s), "slo_attainment": 0.9}
                for r in rates for s in seeds]

    a = _sweep_dir(tmp_path, "r1", None, rows("sfs-cc", [1], [0, 1, 2], lambda r, s: 0.5 + 0.01 * s)
                   + rows("shortest-queue", [1], [0, 1, 2], lambda r, s: 0.3 + 0.01 * s)
                   + rows("oracle", [1], [0, 1, 2], lambda r, s: 0.6))
    b = _sweep_dir(tmp_path, "r2", None, rows("sfs-cc", [2], [0, 1, 2], lambda r, s: 0.4 + 0.01 * s)
                   + rows("shortest-queue", [2], [0, 1, 2], lambda r, s: 0.2)
                   + rows("oracle", [2], [0], lambda r, s: 0.5))
    c = _sweep_dir(tmp_path, "ll", "least-latency", rows("sfs-cc", [1, 2], [0, 1, 2], lambda r, s: 0.55))
    res = acceptance(load_cells([a, b, c]))
    assert res["rates"] == [1.0, 2.0]
    cc = res["routers"]["sfs-cc"]
    assert cc["auc"]["mean"] == pytest.approx(np.mean([(0.5 + 0.4) / 2 + 0.01 * s for s in range(3)]))
    assert res["routers"]["oracle"]["seeds"] == [0]  # seeds 1, 2 did not run every rate
    assert cc["oracle_share_seeds"] == [0] and cc["oracle_share"] == pytest.approx(0.45 / 0.55)
    assert res["best_sfs"] == "sfs-cc[least-latency]"
    vs = res["best_sfs_vs"]["shortest-queue"]
    assert vs["seeds"] == 3 and vs["difference"]["mean"] == pytest.approx(0.55 - np.mean([0.25 + 0.005 * s
                                                                                          for s in range(3)]))
    assert "sfs-cc[least-latency]" in markdown(res)


def test_acceptance_refuses_a_cell_in_two_sweeps(tmp_path):
    from harness.studies.fleet_acceptance import load_cells

    row = [{"router": "sfs-cc", "rate": 1.0, "seed": 0, "ontime_utility": 0.5, "slo_attainment": 0.9}]
    with pytest.raises(ValueError, match="in two sweeps"):
        load_cells([_sweep_dir(tmp_path, "a", None, row), _sweep_dir(tmp_path, "b", None, row)])
