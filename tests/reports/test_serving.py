"""vLLM-style serving metrics: hand-worked cases, and every result carries
them (metrics.json) and a tidy long table (metrics.parquet)."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from reports.serving import parse_goodput, parse_percentiles, serving_metrics, tidy, token_gaps
from tests.conftest import assert_refused, run_cli


def test_hand_worked_requests():
    # arrival, ttft (relative), finish (absolute), output tokens
    req = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0], "ttft_s": [0.1, 0.3, 0.2], "finish_s": [1.1, 2.3, 2.2],
                        "output_tokens": [11, 21, 1], "prompt_tokens": [100, 200, 300]})
    m = serving_metrics(req, (50, 100), {"ttft": 250, "tpot": 95})
    assert m["completed"] == 3 and m["duration_s"] == pytest.approx(2.3)
    # TPOT = (e2e - ttft) / (out - 1): (1.1 - 0.1)/10 = 100 ms, (1.3 - 0.3)/20 = 50 ms; one-token request excluded
    assert m["tpot_ms"]["n"] == 2 and m["tpot_ms"]["mean"] == pytest.approx(75.0)
    assert m["ttft_ms"]["p100"] == pytest.approx(300.0) and m["ttft_ms"]["median"] == pytest.approx(200.0)
    assert m["e2el_ms"]["mean"] == pytest.approx(1e3 * (1.1 + 1.3 + 0.2) / 3)
    assert m["request_throughput"] == pytest.approx(3 / 2.3)
    assert m["output_throughput"] == pytest.approx(33 / 2.3)
    assert m["total_token_throughput"] == pytest.approx(633 / 2.3)
    # goodput: request 0 misses tpot (100 > 95), request 1 misses ttft (300 > 250), request 2 meets both
    assert m["goodput"]["met"] == 1 and m["goodput"]["request_goodput"] == pytest.approx(1 / 2.3)
    assert m["itl_ms"] is None  # no token times: absent, not guessed
    long = tidy(m, router="x")
    assert set(long.columns) == {"router", "metric", "stat", "value"}
    assert long[(long.metric == "tpot_ms") & (long.stat == "mean")]["value"].item() == pytest.approx(75.0)


def test_itl_from_the_steps_that_emitted_tokens():
    req = pd.DataFrame({"request_id": [0], "prompt_tokens": [10]})
    steps = pd.DataFrame({"instance_id": "a", "step": [0, 1, 2, 3], "end_s": [0.1, 0.2, 0.35, 0.4]})
    items = pd.DataFrame({"instance_id": "a", "step": [0, 1, 2, 3], "request_id": 0, "tokens": [6, 4, 1, 1],
                          "computed_before": [0, 6, 10, 11], "prompt_tokens": 10})
    # tokens at 0.2 (prefill done), 0.35, 0.4: gaps 150 ms and 50 ms; step 0 (chunk) emits nothing
    assert np.allclose(token_gaps(req, steps, items), [0.15, 0.05])


def test_option_parsing():
    assert parse_percentiles("50, 90,99.9") == (50.0, 90.0, 99.9)
    assert parse_goodput("ttft:200,tpot:50") == {"ttft": 200.0, "tpot": 50.0}
    for bad in ("0,50", "x"):
        with pytest.raises(ValueError):
            parse_percentiles(bad)
    for bad in ("ttfx:3", "ttft:-1", "ttft:abc", "ttft:nan", "tpot:inf"):  # NaN passed "<= 0"
        with pytest.raises(ValueError):
            parse_goodput(bad)


def test_replay_and_sweep_write_serving_metrics(tmp_path):
    res = run_cli("replay", "--rate", 5, "--requests", 80, "--router", "shortest-queue", "--record-steps",
                  "--metric-percentiles", "50,99", "--goodput", "ttft:300", "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())["serving"]
    assert set(m["ttft_ms"]) == {"n", "mean", "median", "std", "p50", "p99"} and m["itl_ms"]["n"] > 0
    assert m["ttft_ms"]["mean"] == pytest.approx(
        1e3 * json.loads((tmp_path / "r" / "metrics.json").read_text())["ttft_mean_s"])
    long = pd.read_parquet(tmp_path / "r" / "metrics.parquet")
    assert {"ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "request_goodput"} <= set(long["metric"])
    res = run_cli("sweep", "--rates", "4,6", "--requests", 60, "--routers", "shortest-queue", "--workers", 1,
                  "--goodput", "ttft:300", "--out", tmp_path / "s")
    assert res.exit_code == 0, res.output
    long = pd.read_parquet(tmp_path / "s" / "metrics.parquet")
    assert list(long.columns) == ["router", "delta_per_us", "lam", "rate", "seed", "metric", "stat", "value"]
    row = long[(long.metric == "ttft_ms") & (long.stat == "p99") & (long.rate == 6)]
    assert len(row) == 1 and row["value"].item() > 0
    assert {"ontime_utility", "request_goodput", "tpot_ms"} <= set(long["metric"])
    assert_refused(run_cli("replay", "--rate", 5, "--requests", 10, "--goodput", "ttfx:3", "--out", tmp_path / "x"),
                   tmp_path / "x", "--goodput")
