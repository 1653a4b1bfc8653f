"""What the TTFT distribution takes from calibration besides the batch-time
model: the request intake at the joining boundary (``estimators.timemodel.intake``)
and the noise its steps share (``estimators.timemodel.step_correlation``)."""
import numpy as np
import pandas as pd
import pytest

from estimators.engine.layout import ST_PENDING
from estimators.sfs.estimator import SFS
from estimators.snapshot import Query
from estimators.timemodel.intake import Intake, fit_intake, join_columns
from estimators.timemodel.profile import BatchTimeProfile, load_profile
from estimators.timemodel.step_correlation import (
    GRID,
    TrajectoryNoise,
    autocovariance,
    common_var_at,
    common_var_table,
    fit_common_var,
)
from harness.bench.sfs import busy_state
from traces.errors import BadInput


def _recording(n=3000, per_req=0.8e-3, per_tok=0.4e-6, seed=0):
    """Steps of 10 ms with 0.3 ms gaps, plus the intake of requests joining
    at some boundaries; a few requests arrive while the engine idles."""
    rng = np.random.default_rng(seed)
    start, end, t = [], [], 0.0
    joins = rng.random(n) < 0.1
    prompt = rng.integers(50, 2000, n)
    waited = joins & (rng.random(n) < 0.1)
    rows = []
    for k in range(n):
        gap = 0.3e-3 * rng.lognormal(0, 0.1)
        if joins[k]:
            arrival = t + 0.5e-3 if waited[k] else t - 2e-3  # during the gap (idle) or during the last step
            gap += per_req + per_tok * prompt[k] + (5e-3 if waited[k] else 0.0)
            rows.append((k, arrival, t + gap - 1e-5, prompt[k]))
        t += gap
        start.append(t)
        t += 0.01
        end.append(t)
    steps = pd.DataFrame({"step": np.arange(n), "start_s": start, "end_s": end})
    reqs = pd.DataFrame(rows, columns=["request_id", "arrival_s", "added_s", "prompt_tokens"])
    return steps, reqs


def test_intake_fit_recovers_cost_and_ignores_idle_waits():
    steps, reqs = _recording()
    got = fit_intake(join_columns(steps, reqs))
    assert got.per_request_s == pytest.approx(0.8e-3, rel=0.1)
    assert got.per_prompt_token_s == pytest.approx(0.4e-6, rel=0.15)
    assert fit_intake(steps) == Intake()  # no request table: no charge


def test_intake_needs_enough_joins():
    steps, reqs = _recording(n=100)
    assert fit_intake(join_columns(steps, reqs)) == Intake()


def _ar1(n, rho, sigma, rng):
    x = np.empty(n)
    x[0] = rng.normal(0, sigma)
    e = rng.normal(0, sigma * np.sqrt(1 - rho * rho), n)
    for k in range(1, n):
        x[k] = rho * x[k - 1] + e[k]
    return x


def test_common_var_of_ar1_and_of_independent_steps():
    rng = np.random.default_rng(1)
    rho, sigma = 0.8, 0.2
    exact = common_var_table(sigma**2 * rho ** np.arange(GRID[-1] + 1))
    got = fit_common_var([_ar1(200_000, rho, sigma, rng)])
    i = int(np.flatnonzero(GRID == 4)[0])
    assert got[i] == pytest.approx(exact[i], rel=0.1) and exact[i] > 0.5 * sigma**2
    assert got[0] == 0.0  # one step shares nothing
    iid = fit_common_var([rng.normal(0, sigma, 200_000)])
    assert np.all(iid < 0.02 * sigma**2)
    assert not fit_common_var([rng.normal(0, sigma, 100)]).any()  # too few steps to measure


def test_autocovariance_pairs_steps_within_a_sequence_only():
    a, b = np.array([1.0, -1.0, 1.0, -1.0]), np.array([1.0, 1.0, 1.0, 1.0])
    ac = autocovariance([a, b], max_lag=1)
    # centred on the pooled mean 0.5: lag 1 pairs (a) 0.5 * -1.5 three times, (b) 0.5 * 0.5 three times; joined into
    # one sequence it would also pair a's last step with b's first (-0.75 more)
    assert ac[0] == pytest.approx(6 / 8) and ac[1] == pytest.approx((-2.25 + 0.75) / 8)
    assert common_var_at(np.ones(GRID.size), 512) == pytest.approx(0.5)
    assert common_var_at(np.ones(GRID.size), 1) == 0.0


def test_profile_carries_intake_and_shared_noise():
    p = load_profile("qwen3-8b-h100")
    p.intake = Intake(1e-3, 2e-7, 50)
    p.trajectory = TrajectoryNoise(np.linspace(0, 0.02, GRID.size), 1.07)
    q = BatchTimeProfile.from_json(p.to_json())
    assert q.intake == p.intake and np.array_equal(q.trajectory.common_var, p.trajectory.common_var)
    assert q.trajectory.mean_ratio == 1.07
    bad = p.to_json()
    bad["intake"]["per_request_s"] = -1.0
    with pytest.raises(BadInput, match="intake"):
        BatchTimeProfile.from_json(bad)
    bad = p.to_json()
    bad["trajectory_noise"]["common_log_var"][3] = float("nan")
    with pytest.raises(BadInput, match="trajectory_noise"):
        BatchTimeProfile.from_json(bad)
    bad = p.to_json()
    bad["trajectory_noise"]["mean_ratio"] = -1
    with pytest.raises(BadInput, match="mean_ratio"):
        BatchTimeProfile.from_json(bad)
    old = p.to_json()
    del old["intake"], old["trajectory_noise"]
    q = BatchTimeProfile.from_json(old)  # profiles from before: no charge, independent steps
    assert q.intake == Intake() and not q.trajectory.common_var.any() and q.trajectory.mean_ratio == 0.0


def test_sfs_charges_the_intake_of_everyone_joining_with_the_query():
    rng = np.random.default_rng(2)
    lengths = (rng.integers(100, 2000, 64), rng.integers(20, 400, 64))
    snap, pred = busy_state(16, 2, rng, lengths)
    p = load_profile("qwen3-8b-h100")
    base = SFS(p, pred).estimate(snap, Query(len(pred) - 1, 0.0, 700))
    p.intake = Intake(1e-3, 1e-6)
    inbox_prompt = 333  # a request arrived but not joined yet: it joins at the query's boundary
    snap.inbox[0], snap.n_inbox = snap.state.add(len(pred) - 2, inbox_prompt, 10, status=ST_PENDING), 1
    with_inbox = SFS(p, pred).estimate(snap, Query(len(pred) - 1, 0.0, 700))
    p.intake = Intake()
    without = SFS(p, pred).estimate(snap, Query(len(pred) - 1, 0.0, 700))
    assert with_inbox - without == pytest.approx(2e-3 + 1e-6 * (700 + inbox_prompt), rel=1e-9)
    assert base > 0
