"""The request-level fit's rule: the ranges a request log supports, the held-back choice among
candidates, the bootstrap intervals, the weight-read floor; on tiny synthetic logs the twin made
itself from known values (docs/concepts/request-fit.md)."""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from harness.requestlevel.engine_options import REQUEST_TRACE_DEFAULTS
from harness.requestlevel.fit import (
    TTFT_QUANTILES,
    Evaluator,
    RequestFitConfig,
    TraceTargets,
    fit_requests,
    held_back_split,
    profile_of,
    score,
    summary_error,
)
from harness.requestlevel.fit_bounds import Bounds, in_flight_at_arrival
from harness.requestlevel.fit_uncertainty import DrawScore, _jacobian
from harness.requestlevel.simplex import nelder_mead
from harness.requestlevel.validate import RequestTrace, replay_requests
from harness.requestlevel.weight_floor import Floor, kv_read_floor, weight_floor
from tests.conftest import assert_refused, run_cli
from traces.store import TraceWriter

TRUTH = np.array([0.02, 1e-4, 3e-4, 1e-7, 0.05])
ENGINE = replace(REQUEST_TRACE_DEFAULTS, max_num_seqs=8, num_kv_blocks=400)


def synthetic(n: int = 60, rate: float = 6.0, seed: int = 3) -> RequestTrace:
    """``n`` requests at ``rate``/s whose measured TTFT and finish are the twin's own with ``TRUTH``: a
    queue builds (8 seats), so later requests wait longer than earlier ones."""
    rng = np.random.default_rng(seed)
    reqs = pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                         "prompt_tokens": rng.integers(50, 400, n), "output_tokens": rng.integers(5, 60, n)})
    reqs["ttft_s"] = 1.0
    rt = RequestTrace.from_frame(reqs, "synthetic")
    res = replay_requests(rt, profile_of(TRUTH, "truth"), ENGINE, TRUTH[4])
    reqs["ttft_s"] = res.requests["ttft_s"].to_numpy()
    reqs["finish_s"] = res.requests["finish_s"].to_numpy() + TRUTH[4]
    return RequestTrace.from_frame(reqs, "synthetic")


@pytest.fixture(scope="module")
def log() -> RequestTrace:
    return synthetic()


def test_in_flight_at_arrival_by_hand():
    arrival = np.array([0.0, 1.0, 2.0, 3.0, 10.0])
    end = np.array([2.5, 1.5, np.nan, 12.0, 11.0])  # the third request's end is unknown: not counted, and NaN itself
    got = in_flight_at_arrival(arrival, end)
    assert got[[0, 1, 3, 4]].tolist() == [0, 1, 0, 1] and np.isnan(got[2])


def test_ranges_from_a_log_and_the_projection(log):
    b = Bounds.of([log], Floor(0.01, "given"))
    tp = log.tpot()
    assert b.tpot_p5 == pytest.approx(np.nanpercentile(tp[tp > 0], 5))
    r = log.requests
    load = in_flight_at_arrival(r["arrival_s"].to_numpy(), r["finish_s"].to_numpy())
    assert sorted(b.low_ttft) == sorted(r["ttft_s"].to_numpy()[load == load.min()]) and load.max() > load.min()
    # a point outside every range: decode above the TPOT bound, front end and prefill beyond the first TTFT
    v = b.project(np.array([0.5, 1.0, 0.5, 1e-7, 10.0]))
    lo, hi = b._step_range()
    assert lo - 1e-12 <= v[0] + v[2] <= hi + 1e-12
    assert np.all(v[4] + v[1] * b.low_prompt <= b.low_ttft * (1 + 1e-9))
    assert v[4] / v[1] == pytest.approx(10.0 / 1.0)  # front end and prefill scaled down alike
    assert set(b.at_bound(v)) >= {"P", "frontend_overhead_s"}
    inside = b.project(np.array([0.002, 1e-5, 1e-4, 1e-8, 0.001]))  # below the floor: the constant is raised
    assert inside[0] + inside[2] == pytest.approx(0.01) and "const" in b.at_bound(inside)
    assert np.allclose(b.project(inside), inside)
    x, pen = b.penalised(np.log(np.array([0.5, 1.0, 0.5, 1e-7, 10.0])))
    assert pen > 0 and np.allclose(x, v)


def test_a_floor_above_the_tpot_bound_is_dropped_and_said(log):
    b = Bounds.of([log], Floor(10.0, "absurd"))
    assert b.floor.seconds is None and "not applied" in b.floor.why and b.notes


def test_weight_floor_from_a_trace_meta():
    meta = {"source": {"model": "meta-llama/Llama-3.1-8B", "hardware": {"device_name": "NVIDIA GeForce RTX 4090"},
                       "engine_kwargs": {"tensor_parallel_size": 1, "dtype": "bfloat16"}}}
    f = weight_floor(meta)
    assert f.seconds == pytest.approx((8.030e9 - 128_256 * 4096) * 2 / 1.008e12) and len(f.sources) == 2
    meta["source"]["engine_kwargs"]["tensor_parallel_size"] = 2
    assert weight_floor(meta).seconds == pytest.approx(f.seconds / 2)
    no_gpu = {"source": {"model": "Qwen/Qwen3-32B", "engine_kwargs": {"tensor_parallel_size": 2}}}
    assert weight_floor(no_gpu).seconds is None and "GPU" in weight_floor(no_gpu).why
    unknown = {"source": {"model": "acme/Wonder-7B", "gpu": "H100", "engine_kwargs": {"tensor_parallel_size": 1}}}
    assert weight_floor(unknown).seconds is None and "MODEL_PARAMS" in weight_floor(unknown).why
    h100 = {"source": {"model": "meta-llama/Llama-3.1-70B-Instruct", "gpu": "NVIDIA-H100-80GB-HBM3"},
            "engine": {"settings": {"gpus": 4}, "sources": {"gpus": "meta.json engine_kwargs"}}}
    assert "H100 SXM" in weight_floor(h100).why
    h100["engine"]["sources"]["gpus"] = "default"  # a defaulted GPU count is not the run's parallelism
    assert weight_floor(h100).seconds is None and "tensor parallelism" in weight_floor(h100).why
    marked = {"source": {"model": "Qwen/Qwen3-32B"},  # settings marked given / inferred / defaulted at import
              "engine": {"settings": {"gpu": "RTX PRO 6000 Blackwell", "tensor_parallel_size": 2},
                         "marks": {"gpu": "given", "tensor_parallel_size": "inferred"}, "sources": {}}}
    assert weight_floor(marked).seconds == pytest.approx((32.8e9 - 151_936 * 5120) * 2 / (2 * 1.792e12))
    marked["engine"]["marks"]["gpu"] = "defaulted"
    assert weight_floor(marked).seconds is None


def test_simplex_patience_stops_a_search_on_a_plateau():
    def flat(z: np.ndarray) -> float:  # falls, but by less than 0.1% of itself
        return 1.0 + 1e-6 * float((z - 3.0) @ (z - 3.0))

    _, _, evals = nelder_mead(flat, np.zeros(3), max_evals=500, tol=0.0, patience=20)
    assert evals < 40
    _, _, evals = nelder_mead(flat, np.zeros(3), max_evals=500, tol=0.0)
    assert evals > 100  # the simplex itself runs on until its points coincide


def test_held_back_split_keeps_arrival_order(log):
    tg = TraceTargets.of(log)
    early, late = held_back_split([tg], 1 / 3)
    e, lt = early[0].timed(), late[0].timed()
    assert len(e) == 40 and len(lt) == 20 and e.max() < lt.min()
    assert held_back_split([tg.part(np.arange(60) < 15)], 1 / 3) is None  # 10 + 5: too few to hold any back


def test_the_draw_score_is_the_fit_loss_on_the_drawn_rows(log):
    tg = [TraceTargets.of(log)]
    cfg = RequestFitConfig(weights={**RequestFitConfig().weights, "ttft_mean": 0.7, "e2e_mean": 0.3, "e2e_req": 0.2})
    ev = Evaluator(ENGINE, tg, cfg, None)
    logs, jac = _jacobian(ev, TRUTH * 1.3)
    rows = [np.random.default_rng(0).choice(tg[0].timed(), 60)]
    assert DrawScore(logs, jac, tg, rows, cfg.weights, TTFT_QUANTILES)(np.zeros(5)) == pytest.approx(
        score(ev.preds(TRUTH * 1.3), tg, cfg.weights, rows), rel=1e-12)


def test_fit_chooses_the_candidate_that_predicts_the_held_back_part(log):
    b = Bounds.of([log], Floor(None, "not applied: test"))
    cfg = RequestFitConfig(max_evals=30, refine_evals=20, bootstrap=20)
    fit = fit_requests([log], ENGINE, "f", cfg, b)
    held = [c.held_loss for c in fit.candidates]
    assert len(held) >= 3 and fit.chosen == int(np.argmin(held))
    assert np.allclose(b.project(fit.values), fit.values)  # the result is inside the ranges
    u = fit.uncertainty
    assert set(u["coefficients"]) == {"const", "P", "D", "sum_ctx", "frontend_overhead_s"}
    for c in u["coefficients"].values():
        assert c["lo"] <= c["hi"] and isinstance(c["identified"], bool) and c["why"]
    # the figures a run is judged by, on the truth: no error at all
    ev = Evaluator(ENGINE, [TraceTargets.of(log)], cfg, None)
    assert summary_error(ev.preds(TRUTH), ev.targets) == pytest.approx(0.0, abs=1e-12)
    assert summary_error(ev.preds(fit.values), ev.targets) < summary_error(ev.preds(TRUTH * 2), ev.targets)


def test_fit_over_assignments_searches_candidates_on_the_first_only(log):
    """Several replays of one source (a fleet's assignment seeds): candidates on the first, refinement on all."""
    twin = replace(log, source="synthetic")
    fit = fit_requests([log, twin], ENGINE, "f", RequestFitConfig(max_evals=15, refine_evals=10, bootstrap=0,
                                                                   patience=None), None)
    one = fit_requests([log], ENGINE, "f", RequestFitConfig(max_evals=15, refine_evals=10, bootstrap=0,
                                                            patience=None), None)
    assert [c.values.tolist() for c in fit.candidates] == [c.values.tolist() for c in one.candidates]


def test_calibrate_prints_and_stores_ranges_choice_and_intervals(log, tmp_path):
    with TraceWriter(tmp_path / "t") as w:
        w.write_table("requests", log.requests)
    res = run_cli("calibrate", "--from-requests", tmp_path / "t", "--max-evals", "15", "--engine", "max_num_seqs=8",
                  "--engine", "num_kv_blocks=400", "--out", tmp_path / "p.json")
    assert res.exit_code == 0, res.output
    assert "ranges the requests support" in res.output and "95% intervals" in res.output
    assert "weight-read floor not applied: the trace does not name its model" in res.output
    rf = json.loads((tmp_path / "p.json").read_text())["fitted_on"]["request_fit"]
    assert rf["bounds"]["applied"] and rf["bounds"]["weight_floor"]["seconds"] is None
    assert rf["selection"]["chosen"] is not None and len(rf["selection"]["candidates"]) >= 3
    assert set(rf["uncertainty"]["coefficients"]) >= {"const", "D"}


def test_study_refuses_an_unknown_variant_and_missing_data(tmp_path):
    res = run_cli("study", "gpu-fidelity", "--variant", "nope", "--out", tmp_path / "s")
    assert_refused(res, tmp_path / "s", "--variant", "nope")
    res = run_cli("study", "gpu-fidelity", "--data", tmp_path, "--out", tmp_path / "s")
    assert_refused(res, tmp_path / "s", "--data")
    res = run_cli("study", "gpu-fidelity", "--vllm-version", "0.10.1", "--out", tmp_path / "s")
    assert_refused(res, tmp_path / "s", "--vllm-version", "0.10.1")


def test_kv_read_floor_from_a_trace_meta(log):
    """Keys and values of every layer and KV head, per context token, over the GPUs' bandwidth: the
    Llama-3.1-8B on an RTX 4090 reads 128 KiB per token (130 ns); half of it per GPU at TP 2; an fp8
    KV cache halves it; a model whose geometry is not in the table gets no floor, said so."""
    meta = {"source": {"model": "meta-llama/Llama-3.1-8B", "hardware": {"device_name": "NVIDIA GeForce RTX 4090"},
                       "engine_kwargs": {"tensor_parallel_size": 1, "dtype": "bfloat16"}}}
    f = kv_read_floor(meta)
    assert f.seconds == pytest.approx(2 * 32 * 8 * 128 * 2 / 1.008e12) and len(f.sources) == 2
    meta["source"]["engine_kwargs"]["tensor_parallel_size"] = 2
    assert kv_read_floor(meta).seconds == pytest.approx(f.seconds / 2)
    meta["source"]["engine_kwargs"]["kv_cache_dtype"] = "fp8_e4m3"
    assert kv_read_floor(meta).seconds == pytest.approx(f.seconds / 4)
    unknown = {"source": {"model": "acme/Wonder-7B", "gpu": "H100", "engine_kwargs": {"tensor_parallel_size": 1}}}
    assert kv_read_floor(unknown).seconds is None and "KV_GEOMETRY" in kv_read_floor(unknown).why
    b = Bounds.of([log], Floor(None, "none"), Floor(1e-7, "given"))
    v = b.project(np.array([0.002, 1e-5, 1e-4, 1e-9, 0.001]))  # a context term below the floor is raised to it
    assert v[3] == pytest.approx(1e-7) and b.at_bound(v)["sum_ctx"].startswith("lower bound")
    assert b.limits(v)["sum_ctx"][0] == pytest.approx(1e-7) and "KV-read floor" in "\n".join(b.describe())
    assert Bounds.of([log], Floor(None, "none")).project(np.array([0.002, 1e-5, 1e-4, 1e-9, 0.001]))[3] == 1e-9


@pytest.mark.realdata  # two request-level calibrations of the real GPU runs' first 30%: about a minute
def test_real_runs_fit_within_their_ranges_and_say_what_is_not_applied(tmp_path):
    """The RTX 4090 run names its model, GPU and TP: its fit keeps the one-token decode step at or above the
    weight-read floor (14.89 ms), and so do all its bootstrap draws; the PRO 6000 run does not name its GPU:
    the floor is not applied, and the fit says so."""
    from tests.conftest import shared

    data = shared("vllm_gpu_llmservingsim")
    for folder, name in (("RTX4090_Llama-3.1-8B", "r4090"), ("RTXPRO6000_Qwen3-32B", "p6000")):
        assert run_cli("trace", "import", "vllm-reqstats", data / folder, "--out", tmp_path / name).exit_code == 0
    res = run_cli("calibrate", "--from-requests", tmp_path / "r4090", "--fit-window", "0:0.3",
                  "--out", tmp_path / "r.json")
    assert res.exit_code == 0, res.output
    assert "the weight-read floor (llama-3.1-8b" in res.output
    doc = json.loads((tmp_path / "r.json").read_text())
    rf, c = doc["fitted_on"]["request_fit"], {k: v["value"] for k, v in doc["coefficients"].items()}
    floor = rf["bounds"]["weight_floor"]["seconds"]
    assert floor == pytest.approx(0.014890, abs=1e-5) and c["const"] + c["D"] >= floor * (1 - 1e-9)
    assert c["sum_ctx"] >= rf["bounds"]["kv_read_floor"]["seconds"] * (1 - 1e-9)
    assert c["const"] + c["D"] <= rf["bounds"]["tpot_p5_s"]
    step = rf["uncertainty"]["derived"]["decode_step_s"]
    assert floor * (1 - 1e-9) <= step["lo"] <= step["hi"] <= rf["bounds"]["tpot_p5_s"]
    res = run_cli("calibrate", "--from-requests", tmp_path / "p6000", "--fit-window", "0:0.3",
                  "--out", tmp_path / "p.json")
    assert res.exit_code == 0, res.output
    assert "weight-read floor not applied: the trace does not name its GPU" in res.output
    assert json.loads((tmp_path / "p.json").read_text())["fitted_on"]["request_fit"]["bounds"]["weight_floor"][
        "seconds"] is None


def test_candidates_that_predict_as_well_but_disagree_leave_a_value_not_identified():
    from harness.requestlevel.fit_uncertainty import with_candidates

    names = ("const", "P", "D", "sum_ctx", "frontend_overhead_s")
    u = {"coefficients": {n: {"value": 1.0, "lo": 0.9, "hi": 1.1, "identified": True, "why": "identified"}
                          for n in names},
         "derived": {"decode_step_s": {"value": 2.0, "lo": 1.9, "hi": 2.1, "identified": True}}}
    values = [np.array([0.01, 1e-4, 2e-4, 1e-7, 0.1]), np.array([0.05, 1e-4, 1e-4, 1e-7, 0.1]),
              np.array([0.5, 1e-4, 9e-4, 1e-7, 0.1])]
    out = with_candidates(u, names, values, [0.10, 0.12, 0.50])  # the third predicts far worse: left out
    assert out["coefficients"]["const"]["candidates"] == [0.01, 0.05] and not out["coefficients"]["const"]["identified"]
    assert "range from 0.01 to 0.05" in out["coefficients"]["const"]["why"]
    assert out["coefficients"]["D"]["identified"] and out["coefficients"]["P"]["identified"]  # x2 at most
    assert out["derived"]["decode_step_s"]["candidates"] == pytest.approx([0.0102, 0.0501])
    assert not out["derived"]["decode_step_s"]["identified"]


def test_a_host_part_tried_and_not_kept_leaves_the_bootstrap_on_the_five_values(log):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fit = fit_requests([log], ENGINE, "h", RequestFitConfig(max_evals=10, refine_evals=10, bootstrap=10,
                                                                 fit_host=True), None)
    names = set(fit.uncertainty["coefficients"])
    kept = bool(np.all(fit.values[5:] > 0))
    assert names == ({"const", "P", "D", "sum_ctx", "frontend_overhead_s"}
                     | ({"step_gap_s", "host_share"} if kept else set()))
    assert all(np.isfinite([c["lo"], c["hi"]]).all() for c in fit.uncertainty["coefficients"].values())


def test_the_search_under_the_grids_engine_runs_until_it_stalls(log, monkeypatch):
    """The engine grid is scored at values fitted under another engine; the search under the engine it
    chose is a new fit whose result is the profile. Cut at --max-evals while still improving (as it
    was), it ends well above where it stops by itself, nearer the log's truth (loss 0)."""
    import harness.requestlevel.fit as fit_module

    cfg = RequestFitConfig(max_evals=15, refine_evals=10, bootstrap=0, search_engine=True,
                           grid={"max_num_seqs": [8, 16, 64]})
    full = fit_requests([log], replace(ENGINE, max_num_seqs=16), "f", cfg, None)
    monkeypatch.setattr(fit_module, "ENGINE_REFIT_FACTOR", 1)
    cut = fit_requests([log], replace(ENGINE, max_num_seqs=16), "f", cfg, None)
    assert full.engine.max_num_seqs == cut.engine.max_num_seqs == ENGINE.max_num_seqs  # the log's own
    assert full.evals > cut.evals and full.loss < 0.5 * cut.loss
