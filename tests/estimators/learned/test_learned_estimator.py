"""The learned estimator: causality of its online training,
determinism, its cold start, and ``latroute estimate --estimators learned``."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("lightgbm")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from estimators.engine.view import Query  # noqa: E402
from estimators.estimate import teach  # noqa: E402
from estimators.learned.estimator import COLD_START, LEARNED, LearnedTTFT  # noqa: E402
from estimators.learned.features import FEATURES, N_FEATURES  # noqa: E402
from estimators.learned.model import LearnedConfig  # noqa: E402
from estimators.learned.trainer import OnlineTrainer  # noqa: E402

SMALL = LearnedConfig(retrain_every_s=0.0, window=24, min_samples=4, n_estimators=8, min_child_samples=2)


class _State:
    def __init__(self, kv, running, cached):
        self.sc = np.array([running, 0, 0, 0, 0, 0, 0, 0])
        self._kv, self._cached = kv, cached

    def kv_usage(self):
        return self._kv

    def cached_prefix_tokens(self, rid, prompt):
        return self._cached


class _View:
    """The counters a view offers, drawn at random (the features need no more)."""

    def __init__(self, rng):
        self.state = _State(float(rng.random()), int(rng.integers(0, 8)), int(rng.integers(0, 64)))
        self.queued = int(rng.integers(0, 5))
        n = int(rng.integers(0, 6))
        self._prog = (np.arange(n), rng.integers(50, 500, n), rng.integers(0, 500, n), np.zeros(n, dtype=np.int64))

    def resident_progress(self):
        return self._prog


class _Cold:
    name = "throughput"
    speed = 1.0

    def estimate(self, view, q):
        return 0.01 + q.prompt * 1e-4


def _workload(seed: int, n: int):
    """Poisson-ish arrivals, lognormal TTFTs, prompt lengths."""
    rng = np.random.default_rng(seed)
    return np.cumsum(rng.exponential(0.05, n)), rng.lognormal(np.log(0.08), 0.6, n), rng.integers(20, 800, n)


def _run(arrival, ttft, prompts, seed=0, cfg=SMALL):
    """Every query estimated in arrival order, then taught (as ``estimate`` does); the estimates and sources."""
    rng = np.random.default_rng(seed)
    est = LearnedTTFT(_Cold(), OnlineTrainer(cfg), 0.0, 0.3)
    out, src = [], []
    for k, t in enumerate(arrival):
        view, q = _View(rng), Query(k, float(t), int(prompts[k]))
        out.append((est.estimate(view, q), *est.last_dist(1.0)))
        src.append(est.last_source)
        teach(est, view, q, float(ttft[k]))
    return np.array(out), src, est


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1), st.integers(12, 36), st.floats(1.5, 20.0))
def test_later_first_tokens_and_its_own_ttft_change_no_estimate(seed, n, factor):
    arrival, ttft, prompts = _workload(seed, n)
    m = int(np.random.default_rng(seed).integers(n // 2, n))
    base, _, _ = _run(arrival, ttft, prompts)
    later = arrival + ttft >= arrival[m]  # first tokens not strictly before query m's arrival (m's own included)
    assert later[m]
    bumped = np.where(later, ttft * factor, ttft)  # later stays later: only lengthened
    other, _, _ = _run(arrival, bumped, prompts)
    np.testing.assert_array_equal(base[: m + 1], other[: m + 1])


def test_earlier_first_tokens_do_teach():
    arrival, ttft, prompts = _workload(3, 60)
    a, src, est = _run(arrival, ttft, prompts)
    b, _, _ = _run(arrival, ttft * 3.0, prompts)
    learned = np.array(src) == LEARNED
    assert learned.any() and (src[0] == COLD_START)
    assert not np.array_equal(a[learned], b[learned])  # the labels are what it learns from
    np.testing.assert_array_equal(a[~learned], b[~learned])  # the cold start learns nothing
    assert est.trainer.fits > 0 and len(est.trainer.window) <= SMALL.window


def test_same_seed_same_bytes_and_cold_start_until_min_samples():
    n = 50
    arrival, ttft, prompts = _workload(5, n)
    cfg = LearnedConfig(retrain_every_s=0.2, window=30, min_samples=6, n_estimators=20, min_child_samples=3,
                        seed=7)
    a, src, est = _run(arrival, ttft, prompts, cfg=cfg)
    b, _, _ = _run(arrival, ttft, prompts, cfg=cfg)
    assert a.tobytes() == b.tobytes()
    first = src.index(LEARNED)
    known = [(arrival[:k] + ttft[:k] < arrival[k]).sum() for k in range(n)]
    # the cold start answers exactly until min_samples first tokens came back before an arrival
    assert first == next(k for k in range(n) if known[k] >= cfg.min_samples)
    assert all(s == COLD_START for s in src[:first]) and est.trainer.fits > 0
    # quantiles ordered, P(on time) a probability
    assert (a[:, 3] <= a[:, 4] + 1e-12).all() and ((a[:, 1] >= 0) & (a[:, 1] <= 1)).all()


def test_features_are_llmd_s_and_read_no_truth():
    assert N_FEATURES == len(FEATURES) == 9
    assert FEATURES[:5] == ("is_queued", "kv_cache_percentage", "input_token_length", "num_request_waiting",
                            "num_request_running")


def test_config_refuses_nonsense():
    with pytest.raises(ValueError):
        LearnedConfig(window=5, min_samples=10)
    with pytest.raises(ValueError):
        LearnedConfig(retrain_every_s=float("nan"))


def test_estimate_learned_on_a_twin_trace_and_carried_in(tmp_path):
    from estimators.estimate import BaselineParams, EstimateConfig, estimate_trace
    from estimators.timemodel.profile import load_profile
    from harness.cli.estimate import format_metrics
    from tests.conftest import run_cli, served_twin_trace
    from traces.store import open_trace

    path = served_twin_trace(tmp_path / "served")
    trace = open_trace(path)
    # the trace's own (built-in) profiles; hand-made baseline parameters for the cold start
    base = BaselineParams(2e4, 0.01, 8, 1.0, 1.0, 1.0, 0.01, 0.01, 0.0, 0.3)
    models = {i: (load_profile(p), base) for i, p in trace.read("instances")[["instance_id", "profile"]].values}
    cfg = EstimateConfig(estimators=("learned", "throughput"), learned=LearnedConfig(retrain_every_s=2.0))
    res = estimate_trace(trace, models, cfg)
    m = res.metrics["estimators"]["learned"]
    assert m["training"]["retrain_every_s"] == 2.0 and m["training"]["fits"] > 0
    assert set(m["training"]["by_source"]) == {"learned", "cold-start"} and "p90" in m["pinball_s"]
    text = format_metrics(res.metrics)
    assert "learned training:" in text and "learned pinball loss" in text
    a = res.estimates
    assert set(a.loc[a["estimator"] == "learned", "source"]) == {"learned", "cold-start"}
    assert set(a.loc[a["estimator"] == "throughput", "source"]) == {"throughput"}
    # a model trained on another recording (here: the same one) is carried in: no cold start at all
    carried = estimate_trace(trace, models, EstimateConfig(estimators=("learned",), learned_train_on=trace))
    assert set(carried.estimates["source"]) == {"learned"}
    for opt, val in (("--window", "50"), ("--train-on", str(path))):
        refused = run_cli("estimate", path, "--estimators", "throughput", opt, val, "--out", tmp_path / "x")
        assert refused.exit_code == 2 and opt in refused.stderr
