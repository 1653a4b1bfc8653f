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


def test_the_session_prefix_question_imports_each_run_with_and_without_derived_prefixes(tmp_path):
    """The study's second import of a run (``--no-session-prefix``) goes beside the first and keeps the sessions
    without hash_ids; the first has the derived ids."""
    from traces.store import open_trace

    (tmp_path / "per_request.csv").write_text(
        "run_id,prompt_tokens,generation_tokens,ttft_s,generation_time_s,user_id,question_id,launch_rel_s,"
        "launch_time_epoch,finish_time_epoch\nr1,76,20,0.05,0.5,8,1,0.0,1,2\nr1,125,20,0.05,0.5,8,2,2.0,1,2\n")
    log = tmp_path / "commands.log"
    s.import_run(tmp_path, tmp_path / "o", "r1", log)
    s.import_run(tmp_path, tmp_path / "o", "r1", log, session_prefix=False)
    on, off = (open_trace(s.trace_dir(tmp_path / "o", r)).read("requests") for r in ("r1", "r1" + s.NO_PREFIX))
    assert [len(h) for h in on["hash_ids"]] == [4, 7] and "hash_ids" not in off
    assert on["session"].tolist() == off["session"].tolist() == [8, 8]
    assert "--no-session-prefix" in log.read_text()


def test_the_session_prefix_table_shows_the_measured_difference_beside_the_twin():
    row = {"qps": 2.0, "logged_vllm": 210, "logged_llmd": 211, "shared_share": 0.47, "measured_vllm": 0.040,
           "measured_llmd": 0.050}
    for r in s.PREFIX_ROUTERS:
        row |= {f"twin_{r}_on": 0.030, f"twin_{r}_off": 0.045, f"hit_{r}_on": 0.4}
    line = s.prefix_table([row])[2]
    assert "| 2 | 210 / 211 | 47% | 40.0 ms | 50.0 ms | +10.0 ms (+25%) | 30.0 (40%) / 45.0 ms |" in line
