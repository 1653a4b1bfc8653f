"""The serial API front end (``harness.requestlevel.frontend``) and the warm prefix cache of
a request-level replay (``harness.requestlevel.cache``), on a slice of a real
A100 run."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness.requestlevel.cache import WARM_LEAD_S, warm_input
from harness.requestlevel.delivery import MAX_ROUNDS
from harness.requestlevel.engine_options import REQUEST_TRACE_DEFAULTS
from harness.requestlevel.fit import profile_of
from harness.requestlevel.frontend import (
    MEASURED_ACCEPT_SHARE,
    MEASURED_PER_OUTPUT_S,
    MEASURED_PER_REQUEST_S,
    FrontEnd,
    burst_admission,
    fifo_done,
    measured,
    two_phase_done,
)
from harness.requestlevel.frontend_burst import fit_output_cost, held_delays, predicted_delays
from harness.requestlevel.validate import RequestTrace, replay_requests
from tests.conftest import run_cli
from tests.harness.requestlevel.test_request_level import slice_trace  # noqa: F401  (the fixture: 60 requests of the 16 q/s run)
from traces.store import open_trace

BURSTS = Path(__file__).resolve().parents[3] / "docs" / "frontend_burst.csv"
BURST_STEPS = BURSTS.with_name("frontend_burst_steps.csv")
BURST_HELD = BURSTS.with_name("frontend_burst_held.csv")
PROF = np.array([0.03, 1e-4, 2e-4, 0.0, 0.01])


def test_serial_front_end_queues_a_burst_and_leaves_spaced_arrivals_alone():
    fe = FrontEnd(1e-3)
    a = np.array([0.0, 0.0, 0.0, 0.0025, 0.1, 0.1])
    # 0 and the two behind it wait 1 and 2 ms; 2.5 ms waits for the server free at 3 ms; 0.1 s finds it idle
    assert np.allclose(fe.engine_arrivals(a), [0.0, 0.001, 0.002, 0.003, 0.1, 0.101])
    assert np.array_equal(FrontEnd().engine_arrivals(a), a)
    rng = np.random.default_rng(0)
    b = np.sort(rng.exponential(1.0, 500).cumsum())
    e = fe.engine_arrivals(b)
    assert (e >= b).all() and (np.diff(e) >= 1e-3 - 1e-12).all()  # never earlier; served one at a time
    with pytest.raises(ValueError):
        fe.engine_arrivals(np.array([1.0, 0.0]))
    with pytest.raises(ValueError):
        FrontEnd(-1e-3)


def test_measured_cost_is_the_median_of_the_recorded_bursts():
    """The constant in harness.requestlevel.frontend is what its own method gives on the
    stored measurement (five bursts on a real vLLM 0.32 server)."""
    d = pd.read_csv(BURSTS)
    costs, shares = [], []
    for _, g in d.groupby("burst"):
        c = g[["client_id", "arrival_s_client", "ttft_s"]].rename(columns={"arrival_s_client": "arrival_s"})
        s = g[["client_id", "arrival_s_server"]].rename(columns={"arrival_s_server": "arrival_s"})
        r = burst_admission(c, s)
        assert r["requests"] == 200 and r["admission_s"] > r["send_spread_s"] > 0
        costs.append(r["per_request_s"])
        shares.append(r["accept_share"])
    assert len(costs) == 5
    assert abs(float(np.median(costs)) - MEASURED_PER_REQUEST_S) < 0.01e-3
    assert abs(float(np.median(shares)) - MEASURED_ACCEPT_SHARE) < 0.001 and min(shares) > 0.5


def test_two_phases_with_no_accept_are_one_fifo():
    """accept share 0 (the two-phase server with accepts of no cost) gives
    exactly the one-FIFO schedule, over random admissions and deliveries."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        a = np.sort(rng.uniform(0, 0.1, rng.integers(1, 40)))
        ot, n = rng.uniform(0, 0.1, rng.integers(0, 30)), rng.integers(1, 20, 30)
        fe = FrontEnd(0.001, "x", 1e-4)
        n = n[: ot.size]
        done_h, done_o = two_phase_done(a, 0.0, 0.001, ot, 1e-4 * n)
        e, d = fe.schedule(a, ot, n)
        assert np.allclose(np.maximum(done_h - 0.001, a), e) and np.allclose(done_o, d)


def test_a_burst_is_accepted_before_any_is_handled():
    """200 requests at once: every accept (share s of c) first, then the
    handlings in order, so request i reaches the engine (N - 1) a + i b
    after its arrival (queueing only); the first waits for all the accepts,
    as the measured stamps did. Spaced arrivals are untouched, and a
    delivery that comes with a burst is served after its accepts."""
    c, share, n = 1e-3, 0.7, 200
    fe = FrontEnd(c, "x", accept_share=share)
    a, b = share * c, (1 - share) * c
    e = fe.engine_arrivals(np.zeros(n))
    assert np.allclose(e, (n - 1) * a + np.arange(n) * b)
    assert np.allclose(fe.engine_arrivals(np.arange(5) * 0.01), np.arange(5) * 0.01)
    assert e[-1] == pytest.approx(FrontEnd(c, "x").engine_arrivals(np.zeros(n))[-1])  # the same total work
    _, done = FrontEnd(c, "x", 1e-4, accept_share=share).schedule(np.zeros(3), np.array([0.0]), np.array([10]))
    assert done[0] == pytest.approx(3 * a + 3 * b + 10 * 1e-4)  # accepts, then handlings and output by arrival
    assert measured().accept_share == MEASURED_ACCEPT_SHARE
    assert FrontEnd.from_json(measured().to_json()) == measured()
    assert FrontEnd.from_json({"per_request_s": c}).accept_share == 0.0  # profiles before it: one FIFO
    with pytest.raises(ValueError, match="accept share"):
        FrontEnd(c, accept_share=1.5)


def test_one_fifo_server_takes_admissions_and_deliveries_in_time_order():
    fe = FrontEnd(1e-3, "t", 0.5e-3, "t")
    # admissions at 0, 0, 3 ms; a step's 4 tokens at 0.5 ms (2 ms of work) and 1 token at 10 ms
    entry, done = fe.schedule(np.array([0.0, 0.0, 0.003]), np.array([0.0005, 0.010]), np.array([4, 1]))
    # the outputs wait for both admissions queued before them (done at 2 ms), then take 2 ms: done at 4 ms;
    # the admission at 3 ms waits behind them (engine arrival 4 ms, not 3); the lone token at 10 ms waits for nobody
    assert np.allclose(done, [0.004, 0.0105])
    assert np.allclose(entry, [0.0, 0.001, 0.004])
    # without outputs, the admissions alone; without an admission cost, only the outputs queue
    assert np.allclose(fe.engine_arrivals(np.array([0.0, 0.0, 0.003])), [0.0, 0.001, 0.003])
    e2, d2 = FrontEnd(0.0, "t", 0.5e-3, "t").schedule(np.array([0.0, 0.0]), np.array([0.0, 0.0]), np.array([2, 2]))
    assert np.allclose(e2, 0.0) and np.allclose(d2, [0.001, 0.002])
    with pytest.raises(ValueError):
        FrontEnd(0.0, "t", -1e-3)


def test_fifo_done_is_the_server_recursion():
    rng = np.random.default_rng(1)
    t = np.sort(rng.exponential(1e-3, 300).cumsum() * rng.integers(0, 2, 300))
    t.sort()
    c = rng.exponential(1e-3, 300)
    want, prev = [], -np.inf
    for tk, ck in zip(t, c):
        prev = max(tk, prev) + ck
        want.append(prev)
    assert np.allclose(fifo_done(t, c), want, rtol=0, atol=1e-12)


def test_measured_delivery_cost_is_the_median_of_the_recorded_bursts():
    """The per-token constant in harness.requestlevel.frontend is what fit_output_cost
    gives on the stored bursts, each with its own measured admission cost;
    and at that cost the serial server explains the bursts' delivery delays
    (median error under 5 ms on delays of 18-45 ms), which no delivery cost
    at all does."""
    d = pd.read_csv(BURSTS)
    steps = pd.read_csv(BURST_STEPS)
    costs, errs, errs0 = [], [], []
    for b, g in d.groupby("burst"):
        c = g[["client_id", "arrival_s_client", "ttft_s"]].rename(columns={"arrival_s_client": "arrival_s"})
        s = g[["client_id", "arrival_s_server"]].rename(columns={"arrival_s_server": "arrival_s"})
        cin = burst_admission(c, s)["per_request_s"]
        f = fit_output_cost(g, steps[steps["burst"] == b], cin)
        costs.append(f.per_output_s)
        errs.append(f.median_abs_err_s)
        meas, pred0 = predicted_delays(g, steps[steps["burst"] == b], FrontEnd(cin))
        errs0.append(float(np.median(np.abs(pred0 - meas))))
        assert len(f.measured_delay_s) == 200 and np.median(f.measured_delay_s) > 0.015
    assert len(costs) == 5
    assert float(np.median(costs)) == pytest.approx(MEASURED_PER_OUTPUT_S, abs=1e-9)
    assert max(errs) < 5e-3 and min(errs0) > 10e-3  # without a delivery cost, every burst is off by > 10 ms


def test_deliveries_wait_behind_queued_admissions_as_measured():
    """The queue's order, measured: the 53 tokens the engine made while a
    burst's admissions were still queued reached the client ~48 ms later
    (median). One FIFO server for both (each burst's own admission cost,
    the measured delivery cost) predicts them within 10 ms (median); the
    same deliveries with no admission ahead of them are off by > 30 ms."""
    d = pd.read_csv(BURSTS)
    steps, held = pd.read_csv(BURST_STEPS), pd.read_csv(BURST_HELD)
    err = {"fifo": [], "outputs alone": []}
    for b, g in d.groupby("burst"):
        c = g[["client_id", "arrival_s_client", "ttft_s"]].rename(columns={"arrival_s_client": "arrival_s"})
        s = g[["client_id", "arrival_s_server"]].rename(columns={"arrival_s_server": "arrival_s"})
        cin = burst_admission(c, s)["per_request_s"]
        for name, fe in (("fifo", FrontEnd(cin, "t", MEASURED_PER_OUTPUT_S)), ("outputs alone", FrontEnd(0.0, "t", MEASURED_PER_OUTPUT_S))):
            meas, pred = held_delays(g, steps[steps["burst"] == b], held[held["burst"] == b], fe)
            err[name].append(pred - meas)
    fifo, alone = np.concatenate(err["fifo"]), np.concatenate(err["outputs alone"])
    assert len(fifo) == len(held) == 53
    assert np.median(np.abs(fifo)) < 10e-3 and np.median(np.abs(alone)) > 30e-3


def test_front_end_delays_a_burst_in_the_replay(slice_trace):  # noqa: F811
    rt = RequestTrace.of(open_trace(slice_trace))
    reqs = rt.requests.copy()
    reqs["arrival_s"] = 0.0
    burst = RequestTrace.from_frame(reqs, "burst")
    prof = profile_of(PROF, "p")
    plain = replay_requests(burst, prof, REQUEST_TRACE_DEFAULTS, 0.01)
    fe = replay_requests(burst, prof, REQUEST_TRACE_DEFAULTS, 0.01, frontend=FrontEnd(5e-3))
    t = fe.requests["ttft_s"].to_numpy()
    added = fe.requests["added_s"].to_numpy()
    assert np.allclose(added, 5e-3 * np.arange(len(reqs)))
    assert (t >= added + 0.01).all()  # no first token before the engine has the request
    p = plain.requests["ttft_s"].to_numpy()
    assert t[0] == pytest.approx(p[0]) and not np.allclose(t, p)  # the head waits for nobody; the rest do
    assert np.allclose(fe.requests["arrival_s"], 0.0)  # TTFT stays measured from the client's send


def test_deliveries_hold_first_tokens_behind_the_loop_and_settle(slice_trace):  # noqa: F811
    """A burst with a delivery cost: no first token reaches the client
    before the engine made it, the loop's backlog makes later ones later
    than with admissions alone, the engine's own timing is the same, and
    the replay settles within its rounds. Cold and warm alike."""
    rt = RequestTrace.of(open_trace(slice_trace))
    reqs = rt.requests.copy()
    reqs["arrival_s"] = 0.0
    prof = profile_of(PROF, "p")
    for mode in ("cold", "warm"):
        burst = RequestTrace.from_frame(reqs, "burst").warmed(mode)
        adm = replay_requests(burst, prof, REQUEST_TRACE_DEFAULTS, 0.01, record_steps=True, frontend=FrontEnd(1e-3))
        both = replay_requests(burst, prof, REQUEST_TRACE_DEFAULTS, 0.01, frontend=FrontEnd(1e-3, "t", 2e-3, "t"))
        a, b = adm.requests["ttft_s"].to_numpy(), both.requests["ttft_s"].to_numpy()
        assert (b >= a - 1e-12).all() and (b > a + 1e-3).sum() > len(a) // 2
        # all admissions (60 ms) precede any output here: the engine saw the same arrivals and ran the same steps
        assert np.allclose(adm.requests["added_s"], both.requests["added_s"])
        assert np.array_equal(adm.steps["end_s"].to_numpy(), both.steps["end_s"].to_numpy())
        # the last token is delivered through the same queue: never before the engine made it, never before the first
        fa, fb = adm.requests["finish_s"].to_numpy(), both.requests["finish_s"].to_numpy()
        assert (fb >= fa - 1e-12).all() and (fb > fa + 1e-3).any()
        assert (fb + 0.01 >= b - 1e-12).all()  # finish (+ the constant overhead) >= the first token's receipt
        d = both.extra["deliveries"]
        assert 1 <= d["rounds"] <= MAX_ROUNDS and d["unsettled_s"] == 0.0
        assert adm.extra["deliveries"] is None


def test_warm_input_gives_each_prompt_its_blocks_and_a_warm_up():
    reqs = pd.DataFrame({"request_id": [3, 7], "arrival_s": [1.0, 2.0], "prompt_tokens": [40, 15],
                         "output_tokens": [5, 6]})
    w = warm_input(reqs, 16, virtual_engines=2)
    r = w.requests
    assert w.n_warm == 4 and w.per_engine == 2 and len(r) == 6
    assert list(r["request_id"]) == [8, 9, 10, 11, 3, 7]  # warm-up ids past the trace's
    assert [len(h) for h in r["hash_ids"]] == [2, 0, 2, 0, 2, 0]  # full blocks only
    assert r["hash_ids"][0] == r["hash_ids"][4] and r["hash_ids"][0] != r["hash_ids"][1]
    assert (r["output_tokens"][:4] == 1).all() and (r["arrival_s"][:4] == 0).all()
    assert np.allclose(r["arrival_s"][4:], [WARM_LEAD_S, WARM_LEAD_S + 1.0])


def test_warm_reconstruction_carries_the_cache_to_sfs(slice_trace, tmp_path):  # noqa: F811
    """Warm: SFS finds each query's prompt in the reconstructed engine's
    cache (its estimate falls for long prompts); with --cache-blind it
    computes the whole prompt, as before the cache was carried."""
    prof = profile_of(PROF, "w")
    prof.fitted_on = {"request_fit": {"frontend_overhead_s": 0.01, "frontend": FrontEnd(1e-3, "test").to_json()}}
    prof.save(tmp_path / "w.json")
    outs = {}
    for name, extra in (("warm", []), ("blind", ["--cache-blind"])):
        res = run_cli("estimate", slice_trace, "--profile", tmp_path / "w.json", "--prefix-cache", "warm",
                      "--estimators", "sfs", *extra, "--out", tmp_path / name)
        assert res.exit_code == 0, res.output
        outs[name] = pd.read_parquet(tmp_path / name / "estimates.parquet").set_index("request_id")["est_s"]
    assert len(outs["warm"]) == 60  # the warm-up rows are not scored
    p = open_trace(slice_trace).read("requests").set_index("request_id")["prompt_tokens"]
    long_ = p.index[p > 300]
    assert len(long_) and (outs["warm"].loc[long_] < outs["blind"].loc[long_] - 0.02).all()  # > 284 tokens x 1e-4 s
    m = json.loads((tmp_path / "warm" / "metrics.json").read_text())
    assert m["snapshots"]["kind"] == "reconstructed"


def test_warm_set_too_big_for_the_cache_gets_its_hits_outright_with_the_same_timing(slice_trace):  # noqa: F811
    """Hits from the engine's cache and hits handed over time a light run
    alike; a warm set larger than half the KV blocks is handed over."""
    from dataclasses import replace

    rt = RequestTrace.of(open_trace(slice_trace)).warmed("warm")
    prof = profile_of(PROF, "p")
    blocks = int((rt.requests["prompt_tokens"] // 16).sum())
    cache = replay_requests(rt, prof, REQUEST_TRACE_DEFAULTS, 0.01)
    small = replace(REQUEST_TRACE_DEFAULTS, num_kv_blocks=blocks + blocks // 2)
    outright = replay_requests(rt, prof, small, 0.01)
    assert cache.extra["warm_hits"] == "engine cache" and outright.extra["warm_hits"] == "outright"
    assert outright.requests["preemptions"].sum() == 0
    assert np.allclose(cache.requests["ttft_s"], outright.requests["ttft_s"])
    assert (cache.requests["cached_tokens"] == 16 * ((rt.requests["prompt_tokens"] - 1) // 16)).all()


def test_calibrate_carries_the_front_end_to_validate(slice_trace, tmp_path):  # noqa: F811
    res = run_cli("calibrate", "--from-requests", slice_trace, "--frontend", "measured", "--max-evals", "8",
                  "--out", tmp_path / "p.json")
    assert res.exit_code == 0, res.output
    fe = json.loads((tmp_path / "p.json").read_text())["fitted_on"]["request_fit"]["frontend"]
    assert fe["per_request_s"] == MEASURED_PER_REQUEST_S and fe["source"].startswith("measured")
    res = run_cli("validate", slice_trace, "--profile", tmp_path / "p.json", "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "v" / "metrics.json").read_text())["frontend"]["per_request_s"] == fe["per_request_s"]
    res = run_cli("calibrate", "--from-requests", slice_trace, "--frontend-per-request", "2.5", "--max-evals", "8",
                  "--out", tmp_path / "q.json")
    assert res.exit_code == 0, res.output
    q = json.loads((tmp_path / "q.json").read_text())["fitted_on"]["request_fit"]["frontend"]
    assert q["per_request_s"] == pytest.approx(2.5e-3) and q["per_output_s"] == 0.0  # no --frontend: no deliveries
    assert fe["per_output_s"] == MEASURED_PER_OUTPUT_S
    res = run_cli("calibrate", "--from-requests", slice_trace, "--frontend", "measured", "--frontend-per-output", "0.3",
                  "--max-evals", "8", "--out", tmp_path / "o.json")
    assert res.exit_code == 0, res.output
    o = json.loads((tmp_path / "o.json").read_text())["fitted_on"]["request_fit"]["frontend"]
    assert o["per_output_s"] == pytest.approx(0.3e-3) and o["per_request_s"] == MEASURED_PER_REQUEST_S
    res = run_cli("calibrate", "--from-requests", slice_trace, "--frontend-per-output", "-0.1", "--out", tmp_path / "n.json")
    assert res.exit_code == 2 and not (tmp_path / "n.json").exists()
    res = run_cli("calibrate", "--from-requests", slice_trace, "--frontend-per-request", "-1", "--out", tmp_path / "r.json")
    assert res.exit_code == 2 and not (tmp_path / "r.json").exists()
