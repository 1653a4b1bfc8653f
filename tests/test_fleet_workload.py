"""Fleet-sized workloads: the Azure conversation trace's arrival
shape at fleet rates (``--arrival azure-conv``), and traces of hundreds of
q/s through ``trace generate`` and a sweep cell's ``--trace`` path."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_cli, shared
from traces.store import open_trace
from traces.workload.arrivals import ArrivalSpec, generate_arrivals
from traces.workload.azure_shape import AZURE_CONV_COUNTS, BIN_S, SHAPE_BINS, shape_counts, shaped_arrivals


def test_shape_is_the_azure_conversation_trace():
    """The embedded counts are the CSV's, recomputed (a wrong bin or start would differ)."""
    csv = shared("azure_llm_2023", "AzureLLMInferenceTrace_conv.csv")
    ts = pd.to_datetime(pd.read_csv(csv, usecols=["TIMESTAMP"])["TIMESTAMP"])
    t = (ts - ts.iloc[0]).dt.total_seconds().to_numpy()
    assert tuple(int(c) for c in shape_counts(t)) == AZURE_CONV_COUNTS
    assert len(AZURE_CONV_COUNTS) == SHAPE_BINS


@pytest.mark.parametrize("duration", [3600.0, 1234.5])
def test_mean_rate_is_the_target_for_any_duration(duration):
    """Cycled past 3,500 s or cut short, the expected rate is --rate (the
    un-normalised shape would give 253.7 q/s for an hour at 256: the wrap
    repeats the trace's quiet start)."""
    rate = 300.0
    t = shaped_arrivals(rate, np.random.default_rng(0), duration=duration)
    expected = rate * duration
    assert abs(t.size - expected) < 4 * np.sqrt(expected)
    assert np.all(np.diff(t) >= 0) and t.min() >= 0 and t.max() < duration


def test_the_hour_keeps_the_trace_shape():
    """Per-10 s counts follow the trace's: correlation with the shape near
    1 at a fleet rate, and overdispersed far beyond Poisson (index 1)."""
    t = shaped_arrivals(256.0, np.random.default_rng(1), duration=SHAPE_BINS * BIN_S)
    counts = np.bincount((t // BIN_S).astype(np.int64), minlength=SHAPE_BINS)[:SHAPE_BINS]
    assert np.corrcoef(counts, AZURE_CONV_COUNTS)[0, 1] > 0.98
    assert counts.var() / counts.mean() > 50  # the shape's swings scaled up, not Poisson noise
    poisson = generate_arrivals(ArrivalSpec("poisson", rate=256.0), np.random.default_rng(1), duration=3500.0)
    pc = np.bincount((poisson // BIN_S).astype(np.int64))[:SHAPE_BINS]
    assert pc.var() / pc.mean() < 2


def test_count_mode_and_determinism():
    spec = ArrivalSpec("azure-conv", rate=500.0)
    a = generate_arrivals(spec, np.random.default_rng(7), n=50_000)
    b = generate_arrivals(spec, np.random.default_rng(7), n=50_000)
    assert a.size == 50_000 and np.array_equal(a, b) and np.all(np.diff(a) >= 0)
    c = generate_arrivals(spec, np.random.default_rng(8), n=50_000)
    assert not np.array_equal(a, c)


def test_trace_generate_azure_conv_at_fleet_rate(tmp_path):
    out = tmp_path / "az"
    r = run_cli("trace", "generate", "--out", str(out), "--arrival", "azure-conv", "--rate", "400",
                "--duration", "60", "--seed", "3")
    assert r.exit_code == 0, r.output
    t = open_trace(out)
    req = t.read("requests")
    assert abs(len(req) / 60.0 / 400.0 - 1) < 0.05
    assert t.meta["generator"]["arrivals"]["kind"] == "azure-conv"
    assert t.meta["tables"]["quality"] == 3 * len(req)


def test_azure_conv_refuses_a_burstiness(tmp_path):
    r = run_cli("trace", "generate", "--out", str(tmp_path / "x"), "--arrival", "azure-conv", "--rate", "100",
                "--duration", "10", "--burstiness", "0.5")
    assert r.exit_code == 2 and "burstiness" in r.output


def test_sweep_cell_on_a_fleet_rate_trace(tmp_path):
    """``sweep --trace`` at hundreds of q/s: a cell's requests are the
    trace's first N with arrivals rescaled to the cell's rate, the shape kept."""
    from harness.sweep.driver import Cell, SweepSpec, cell_workload

    out = tmp_path / "az"
    assert run_cli("trace", "generate", "--out", str(out), "--arrival", "azure-conv", "--rate", "256",
                   "--duration", "30").exit_code == 0
    reqs, quality = cell_workload(SweepSpec(pool="qwen3-h100-x8", trace=str(out), requests=5000),
                                  Cell(rate=512.0, router="shortest-queue"))
    t = reqs["arrival_s"].to_numpy()
    assert len(reqs) == 5000 and t[0] == 0 and abs((t.size - 1) / t[-1] / 512.0 - 1) < 1e-9
    assert quality is not None and len(quality) >= 3 * 5000


def test_head_and_id_reads_are_the_whole_reads_rows(tmp_path):
    """A cell's rows streamed from a trace are exactly the rows a whole read gives."""
    out = tmp_path / "wl"
    assert run_cli("trace", "generate", "--out", str(out), "--requests", "3000", "--rate", "300").exit_code == 0
    t = open_trace(out)
    full, fq = t.read("requests"), t.read("quality")
    pd.testing.assert_frame_equal(t.read("requests", head=1234), full.iloc[:1234])
    ids = np.array([5, 17, 2999])
    got = t.read("quality", request_ids=ids)
    pd.testing.assert_frame_equal(got, fq[fq["request_id"].isin(ids)].reset_index(drop=True))
    assert list(t.read("quality", columns=["acc"], request_ids=ids).columns) == ["acc"]
    assert len(t.read("requests", head=10**6)) == 3000
