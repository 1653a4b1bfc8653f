"""Runs that logged fewer requests than they sent are refused at import, saying how many are missing and
where, unless --allow-incomplete; `trace info` shows the completeness. Sources: LMBench's fixed-rate
ShareGPT schedule (its launch slots), `vllm bench serve`'s num_prompts, a vllm-reqstats run's
num_requests."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd

from tests.conftest import assert_refused, run_cli, shared
from traces.importers.completeness import launch_slots, lmbench, ranges
from traces.store import open_trace

HEAD = "run_id,prompt_tokens,generation_tokens,ttft_s,generation_time_s,user_id,question_id,launch_rel_s," \
       "launch_time_epoch,finish_time_epoch"
RUNS = "run_id,stack,gpu,workload,target_qps\n"


def _lmbench(tmp_path, slots, qps=4.0, workload="sharegpt", lag=None, stack="vllm"):
    """An LMBench per_request.csv of run r9 launching at ``slots`` / qps (plus ``lag`` s each), logged in
    completion order (reversed), and its runs.csv row."""
    rng = np.random.default_rng(0)
    launch = np.asarray(slots, dtype=np.float64) / qps + (lag if lag is not None else rng.uniform(0, 0.1 / qps,
                                                                                                   len(slots)))
    launch -= launch.min()
    rows = [f"r9,{100 + i % 50},{20 + i % 7},0.05,1.0,,,{t:.6f},{1e9 + t:.6f},{1e9 + t + 1.05:.6f}"
            for i, t in enumerate(launch)][::-1]
    src = tmp_path / "per_request.csv"
    src.write_text(HEAD + "\n" + "\n".join(rows) + "\n")
    (tmp_path / "runs.csv").write_text(RUNS + f"r9,{stack},NVIDIA-H100-80GB-HBM3,{workload},{qps:g}\n")
    return src


def test_lmbench_run_missing_launch_slots_is_refused_unless_allowed(tmp_path):
    missing = {5, 6, 100} | set(range(241, 252))
    src = _lmbench(tmp_path, [s for s in range(252) if s not in missing])
    out = tmp_path / "t"
    assert_refused(run_cli("trace", "import", "lmbench", src, "--run", "r9", "--out", out), out,
                   "per_request.csv: launch_rel_s: incomplete: 14 of 252 requests not logged "
                   "(launch slots of 1/4 s: 5-6, 100, 241-251 of 0-251)", "--allow-incomplete")
    res = run_cli("trace", "import", "lmbench", src, "--run", "r9", "--out", out, "--allow-incomplete")
    assert res.exit_code == 0, res.output
    done = open_trace(out).meta["completeness"]
    assert (done["status"], done["sent"], done["logged"], done["missing"], done["allowed"]) == \
        ("incomplete", 252, 238, 14, True)
    info = run_cli("trace", "info", out).output
    assert "completeness   14 of 252 missing (238 logged; launch slots of 1/4 s: 5-6, 100, 241-251 of 0-251); " \
           "imported with --allow-incomplete" in info
    # every slot logged: complete, and said so
    res = run_cli("trace", "import", "lmbench", _lmbench(tmp_path, range(252)), "--run", "r9", "--out", tmp_path / "c")
    assert res.exit_code == 0 and "complete: 252 of 252 sent logged" in res.output
    assert "completeness   complete: 252 of 252 sent logged" in run_cli("trace", "info", tmp_path / "c").output


def test_launch_slots_need_launches_near_the_grid():
    slots, why = launch_slots(np.array([0.0, 0.26, 0.5, 1.02]), 4.0)  # 0.04 and 0.08 of a slot late
    assert slots.tolist() == [0, 1, 2, 4] and "within 0.08" in why
    assert launch_slots(np.array([0.0, 0.1, 0.5]), 4.0)[0] is None  # 0.4 of a slot off: no telling
    assert launch_slots(np.array([0.0, 0.24, 0.27, 0.5]), 4.0)[0] is None  # two launches in one slot
    # not the ShareGPT client: no run size; gaps are a lower bound, no gap says nothing
    c = lmbench(np.array([0.0, 0.25, 1.0]), 4.0, "short_input")
    assert (c.status, c.sent, c.missing) == ("incomplete", None, 2) and "at least 2" in c.line()
    assert lmbench(np.array([0.0, 0.25, 0.5]), 4.0, "short_input").status == "unknown"
    assert lmbench(np.array([0.0, 0.1, 0.5]), 4.0, "sharegpt").missing == 249  # the count still speaks
    assert lmbench(np.arange(300) / 4.0, 4.0, "sharegpt").status == "unknown"  # more than the file: not it
    assert ranges(np.array([1, 2, 3, 7])) == "1-3, 7"


def test_real_lmbench_h100_runs_missing_requests_show_as_skipped_slots(tmp_path):
    """exp-3/H100: the llm-d router's ShareGPT runs logged 110-203 of the 252 requests their fixed-rate
    schedule launched, the vLLM round-robin run at 16 q/s 68; the other vLLM runs all 252. The launches
    sit near the 1/qps grid (launch_rel_s x QPS skips integers where requests are missing); exp-4's
    runs at high rates fall behind their grid but logged all 252."""
    src = shared("llmd_lmbench_per_request", "per_request.csv")
    runs = pd.read_csv(src.with_name("runs.csv")).set_index("run_id")
    rows = pd.read_csv(src, usecols=["run_id", "launch_rel_s"])
    llmd = [f"r{i}" for i in range(201, 211)]
    logged = []
    for run in llmd:
        c = lmbench(rows.loc[rows["run_id"] == run, "launch_rel_s"].to_numpy(), float(runs.loc[run, "target_qps"]),
                    runs.loc[run, "workload"])
        assert c.status == "incomplete" and c.sent == 252 and "launch slots of" in c.where, (run, c.line())
        logged.append(c.logged)
    assert (min(logged), max(logged)) == (110, 203)
    out = tmp_path / "r209"
    assert_refused(run_cli("trace", "import", "lmbench", src, "--run", "r209", "--out", out), out,
                   "incomplete: 142 of 252 requests not logged (launch slots of 1/40 s: 85, 102,", "135-251 of 0-251")
    assert_refused(run_cli("trace", "import", "lmbench", src, "--run", "r232", "--out", out), out,
                   "incomplete: 184 of 252")
    for run in ("r238", "r336"):  # vLLM at 4 q/s; Llama-4-Scout at 95 q/s, launches off the grid
        res = run_cli("trace", "import", "lmbench", src, "--run", run, "--out", tmp_path / run)
        assert res.exit_code == 0 and "complete: 252 of 252 sent logged" in res.output, res.output


def test_vllm_bench_num_prompts_and_reqstats_num_requests(tmp_path):
    doc = {"num_prompts": 6, "request_rate": 2.0, "input_lens": [10, 20, 30, 40], "output_lens": [5, 6, 7, 8],
           "ttfts": [0.1, 0.2, 0.3, 0.4], "errors": ["", "", "", ""]}
    src = tmp_path / "b.json"
    src.write_text(json.dumps(doc))
    out = tmp_path / "b"
    assert_refused(run_cli("trace", "import", "vllm-bench", src, "--out", out), out,
                   "b.json: num_prompts: incomplete: 2 of 6 requests not logged (2 not in the file)")
    run = shared("vllm_gpu_llmservingsim", "RTX4090_Llama-3.1-8B")
    d = tmp_path / "run"
    shutil.copytree(run, d)
    lines = (d / "requests.jsonl").read_text().splitlines(keepends=True)
    (d / "requests.jsonl").write_text("".join(lines[:10] + lines[13:]))  # requests 10-12 not logged
    assert_refused(run_cli("trace", "import", "vllm-reqstats", d, "--out", out), out,
                   "meta.json: num_requests: incomplete: 3 of 300 requests not logged (request ids 10-12)")
    res = run_cli("trace", "import", "vllm-reqstats", d, "--out", out, "--allow-incomplete")
    assert res.exit_code == 0, res.output
    assert open_trace(out).meta["completeness"]["missing"] == 3


def test_a_bad_completeness_or_engine_section_in_meta_json_is_refused_by_key(tmp_path):
    src = _lmbench(tmp_path, range(252))
    out = tmp_path / "t"
    assert run_cli("trace", "import", "lmbench", src, "--run", "r9", "--out", out).exit_code == 0
    meta_path = out / "meta.json"
    good = json.loads(meta_path.read_text())
    for key, value, fragment in (("completeness", {"status": "mostly"}, "completeness.status"),
                                 ("completeness", {"status": "complete", "missing": -1}, "completeness.missing"),
                                 ("engine", {"marks": {"max_num_seqs": "guessed"}}, "engine.marks.max_num_seqs"),
                                 ("engine", {"accepted_unmodelled": "lmcache"}, "engine.accepted_unmodelled")):
        meta_path.write_text(json.dumps({**good, key: value}))
        assert_refused(run_cli("trace", "info", out), None, "meta.json", fragment)
