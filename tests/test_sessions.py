"""Multi-turn session workloads: prefix-chained hash ids, growing history,
the request rate kept, the paper's SLO rule, determinism, and the ideal hit rate
that ``trace info`` reports."""
from __future__ import annotations

import numpy as np
import pandas as pd

from tests.conftest import run_cli
from traces.store import open_trace
from traces.workload.sessions import SessionConfig, generate_sessions


def test_ids_are_prefix_chained_and_history_grows():
    r = generate_sessions(SessionConfig(requests=3000, rate=8, seed=1)).requests
    hb = 16
    prefix_of: dict[int, tuple] = {}  # id -> the prefix it stands on
    for ids, p in zip(r["hash_ids"], r["prompt_tokens"]):
        assert len(ids) == p // hb  # one id per full block
        for i, h in enumerate(ids):
            assert prefix_of.setdefault(int(h), tuple(ids[:i])) == tuple(ids[:i])
    for _, s in r.groupby("session"):
        s = s.sort_values("turn")
        assert s["turn"].tolist() == list(range(len(s)))
        assert (np.diff(s["arrival_s"]) >= 0).all()
        prev = None
        for ids, p, o in zip(s["hash_ids"], s["prompt_tokens"], s["output_tokens"]):
            if prev is not None:
                assert p > prev[1] + prev[2]  # previous prompt + its output + a follow-up
                assert list(ids[: prev[1] // hb]) == list(prev[0][: prev[1] // hb])
            prev = (ids, p, o)
    first = r[r["turn"] == 0]
    assert first["hash_ids"].map(lambda x: int(x[0])).nunique() <= 4  # shared system prompts
    rate = len(r) / r["arrival_s"].max()
    assert 6.5 < rate < 9.5
    assert r["session"].nunique() < len(r) / 2.5


def test_slo_and_determinism(tmp_path):
    a = generate_sessions(SessionConfig(duration_s=60, rate=4, seed=3))
    b = generate_sessions(SessionConfig(duration_s=60, rate=4, seed=3))
    pd.testing.assert_frame_equal(a.requests, b.requests)
    r = a.requests
    assert (r["arrival_s"] < 60).all()
    base = 0.155 + 0.035e-3 * r["prompt_tokens"].to_numpy()  # the paper's SLO rule, per request
    assert np.all(r["slo_ttft_s"] >= np.clip(base * 0.98, 0.15, 1.12) - 1e-12)
    assert np.all(r["slo_ttft_s"] <= np.clip(base * 1.02, 0.15, 1.12) + 1e-12)
    assert len(a.quality) == 3 * len(r)


def test_cli_sessions_and_ideal_hit_rate(tmp_path):
    res = run_cli("trace", "generate", "--out", tmp_path / "s", "--sessions", "--requests", "400", "--rate", "8")
    assert res.exit_code == 0, res.output
    t = open_trace(tmp_path / "s")
    assert t.meta["hash_block_tokens"] == 16 and len(t.read("requests")) == 400
    info = run_cli("trace", "info", tmp_path / "s", "--json")
    import json
    rate = json.loads(info.output)["prefix"]["ideal_hit_rate"]
    assert 0.3 < rate < 0.95
    res = run_cli("trace", "generate", "--out", tmp_path / "x", "--sessions", "--requests", "10", "--rate", "8",
                  "--arrival", "mmpp")
    assert res.exit_code == 2 and "--sessions" in res.output and not (tmp_path / "x").exists()


def test_info_reports_ideal_and_recorded_hit_rate_of_a_recording(tmp_path):
    """d9 (64 KV blocks) hits 65% of its prompt tokens against 72% with an
    unbounded cache (PROVENANCE)."""
    from tests.conftest import shared
    from traces.summary import summarize

    rec = shared("vllm_cpu", "d9_tinya_sessions_kv64_pc")
    assert run_cli("trace", "import", "vllm-record", rec, "--out", tmp_path / "d9").exit_code == 0
    p = summarize(open_trace(tmp_path / "d9"))["prefix"]
    assert abs(p["ideal_hit_rate"] - 0.72) < 0.005 and abs(p["recorded_hit_rate"] - 0.65) < 0.005
