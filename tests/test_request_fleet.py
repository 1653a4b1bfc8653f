"""Request logs of a fleet: replicas, their assignment (logged or a stated
policy with seeds), the replicas a run's own completions imply, pools
naming a fitted profile, and the engine view with several engines."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from harness.requestlevel.engine_options import REQUEST_TRACE_DEFAULTS
from harness.requestlevel.fit import profile_of
from harness.requestlevel.validate import RequestTrace, replay_requests
from tests.conftest import run_cli
from tests.test_reqstats_import import _request, _run

PROFILE = np.array([0.02, 2e-5, 2e-4, 1e-8, 0.01])  # const, P, D, sum_ctx, front-end overhead


def _profile(path, virtual_engines: int = 1, engine: dict | None = None):
    prof = profile_of(PROFILE, path.stem)
    prof.fitted_on = {"engine": engine or {"max_num_seqs": 8, "max_num_batched_tokens": 512, "num_kv_blocks": 640},
                      "request_fit": {"frontend_overhead_s": float(PROFILE[4]), "virtual_engines": virtual_engines}}
    prof.save(path)
    return path


def test_engine_view_with_virtual_engines_reads_each_engines_own_steps(tmp_path):
    """Two virtual engines number their steps alike: a request's first
    scheduled step is looked up in its own engine's log (the lookup by
    number alone ended ``validate`` in a TypeError)."""
    from harness.requestlevel.engine_view import _first_scheduled

    reqs = pd.DataFrame({"request_id": np.arange(24), "arrival_s": 0.05 * np.arange(24),
                         "prompt_tokens": np.full(24, 300), "output_tokens": np.full(24, 30),
                         "ttft_s": np.full(24, 0.1)})
    rt = RequestTrace.from_frame(reqs, "mem")
    res = replay_requests(rt, profile_of(PROFILE, "p"), REQUEST_TRACE_DEFAULTS, 0.0, record_steps=True,
                          virtual_engines=2)
    steps, items = res.steps, res.step_items
    assert steps.groupby("step")["instance_id"].nunique().max() == 2  # step numbers repeat across the engines
    got = _first_scheduled(res, len(reqs))
    for rid in range(24):
        mine = items[items["request_id"] == rid]
        inst, step = mine["instance_id"].iloc[0], mine["step"].min()
        want = steps[(steps["instance_id"] == inst) & (steps["step"] == step)]["start_s"].item()
        assert got[rid] == pytest.approx(want)
    assert len(set(res.requests["instance_id"])) == 2


def test_validate_with_a_two_virtual_engine_profile_on_vllm_stamps(tmp_path):
    reqs = [_request(i, 0.1 * i, out=20) for i in range(16)]
    res = run_cli("trace", "import", "vllm-reqstats", _run(tmp_path, reqs), "--out", tmp_path / "t",
                  "--engine", "num_kv_blocks=640")
    assert res.exit_code == 0, res.output
    prof = _profile(tmp_path / "p.json", virtual_engines=2)
    res = run_cli("validate", tmp_path / "t", "--profile", prof, "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "v" / "metrics.json").read_text())
    assert m["virtual_engines"] == 2
    q = m["engine_view"]["queueing"]
    assert q["n"] == 16 and np.isfinite(q["mean"]["twin"])
