"""The LMBench H100 study (``latroute study lmbench-h100``): what it compares and what it counts, on tiny
inputs (the study itself runs on the shared logs, minutes long; its page shows the run)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from harness.studies import lmbench_h100 as s
from tests.conftest import run_cli
from traces.store import TraceWriter


def _trace(root, rid, arrivals, prompts):
    with TraceWriter(s.trace_dir(root, rid)) as w:
        n = len(arrivals)
        w.write_table("requests", pd.DataFrame({
            "request_id": np.arange(n), "arrival_s": np.asarray(arrivals, dtype=np.float64),
            "prompt_tokens": np.asarray(prompts, dtype=np.int64), "output_tokens": np.full(n, 8),
            "ttft_s": np.full(n, 0.1)}))


def test_requests_every_run_logged_are_matched_by_slot_and_prompt(tmp_path):
    """At 2 q/s a launch's slot is the nearest half second. Run B lost slot 2, and one of its launches lagged
    into its neighbour's slot: that one carries another prompt and matches nothing, rather than pairing."""
    _trace(tmp_path, "A", [0.0, 0.5, 1.0, 1.5, 2.0], [10, 11, 12, 13, 14])
    _trace(tmp_path, "B", [0.0, 0.52, 1.74, 2.01], [10, 11, 13, 14])  # slot 3's launch 0.24 s late
    _trace(tmp_path, "C", [0.0, 0.96, 1.5, 2.0], [10, 11, 13, 14])  # slot 1's launch lagged into slot 2
    keys = s.common_slots(tmp_path, ["A", "B", "C"], 2.0)
    shared = set.intersection(*(set(k.tolist()) for k in keys.values()))
    prompts = sorted(int(k % 1_000_000) for k in shared)
    assert prompts == [10, 13, 14]
    assert np.isin(keys["B"], list(shared)).tolist() == [True, False, True, True]


def test_targets_count_only_complete_runs_not_fitted_on():
    row = {"ttft_mean": 0.05, "ttft_p90": 0.1, "mape_sfs": 0.2, "mape_lps": 0.5}
    res = {"group": {"fit_qps": (4.0,)}, "rows": [
        {**row, "qps": 4.0, "in_fit": True, "complete": "complete"},
        {**row, "qps": 8.0, "in_fit": False, "complete": "complete"},
        {**row, "qps": 16.0, "in_fit": False, "complete": "incomplete", "ttft_mean": 5.0},
        {**row, "qps": 20.0, "in_fit": False, "complete": "complete", "ttft_mean": -0.3, "ttft_p90": None},
    ]}
    lines = s.targets(res)
    assert "1 of 2 complete runs" in lines[0] and "1 of 2" in lines[1]  # the fitted and the incomplete run left out
    assert "1 of 1" in lines[2] and "4 of 4 runs" in lines[3]  # SFS at the fitted rates only; LPS everywhere


def test_study_refuses_a_data_folder_without_the_logs(tmp_path):
    res = run_cli("study", "lmbench-h100", "--data", tmp_path, "--out", tmp_path / "o")
    assert res.exit_code == 2 and "per_request.csv" in res.output and not (tmp_path / "o").exists()
