"""Probabilistic SFS: the analytic distribution against a brute-force Monte
Carlo over the twin's own noise draws, with the trajectory fixed."""
import numpy as np

from estimators.engine.timing import rng_state
from estimators.sfs import SFS
from estimators.sfs_dist import mc_ttft
from estimators.snapshot import Query
from harness.bench_sfs import busy_state
from harness.bench_sfs_dist import _profile


def _case(p_stall, n=16, prompt=3000, seed=1):
    rng = np.random.default_rng(seed)
    lengths = (rng.integers(100, 2000, 128), rng.integers(20, 400, 128))
    snap, pred = busy_state(n, 2, rng, lengths)
    sfs = SFS(_profile(p_stall), pred)
    typ = np.zeros(10_000)
    total = sfs.estimate(snap, Query(len(pred) - 1, 0.0, prompt), typ)
    typ = typ[: sfs.last_steps].copy()
    samples = np.empty(20_000)
    mc_ttft(total, typ, sfs.model.mult, sfs._nm[0], sfs.model.noise, sfs.model.stall_q, sfs.model.stall_v,
            samples.size, rng_state(seed), samples)
    return sfs, total, samples


def test_quantiles_match_monte_carlo_with_stalls():
    sfs, total, samples = _case(0.05)
    d = sfs.last_dist(float(np.median(samples)))
    assert d.mean == total and d.p50 < d.p90 < d.p99
    assert abs(samples.mean() - total) / total < 0.01  # the mean is SFS's point estimate
    for level, v in ((0.5, d.p50), (0.9, d.p90), (0.99, d.p99)):
        assert abs(np.mean(samples <= v) - level) < 0.02, level
    assert abs(d.p_on_time - 0.5) < 0.03


def test_p_on_time_matches_monte_carlo_across_slos():
    sfs, _, samples = _case(None, n=64)
    for s in np.quantile(samples, [0.05, 0.3, 0.7, 0.95]):
        assert abs(sfs.p_on_time(float(s)) - np.mean(samples <= s)) < 0.03


def test_no_noise_is_a_point_mass():
    sfs, total, _ = _case(None)
    sfs._nm = sfs._nm.copy()
    sfs._nm[2] = sfs._nm[3] = 0.0  # no jitter variance, no stalls
    d = sfs.last_dist(total)
    assert d.p50 == d.p99 == total and d.p_on_time == 1.0
    assert sfs.p_on_time(total * 0.999) == 0.0
