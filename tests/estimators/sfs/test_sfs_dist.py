"""Probabilistic SFS: the analytic distribution against a brute-force Monte
Carlo over the twin's own noise draws, with the trajectory fixed (in-flight
remainder and common factor included)."""
import numpy as np
import pytest

from estimators.engine.timing import rng_state
from estimators.sfs.dist import mc_ttft, remainder_moments
from estimators.sfs.estimator import SFS
from estimators.snapshot import Query
from estimators.timemodel.step_correlation import GRID, TrajectoryNoise
from harness.bench.sfs import busy_state
from harness.bench.sfs_dist import _profile


def _case(p_stall, n=16, prompt=3000, seed=1, common=0.0, elapsed=None, mean_ratio=0.0):
    rng = np.random.default_rng(seed)
    lengths = (rng.integers(100, 2000, 128), rng.integers(20, 400, 128))
    snap, pred = busy_state(n, 2, rng, lengths)
    profile = _profile(p_stall)
    profile.trajectory = TrajectoryNoise(np.where(GRID > 1, common, 0.0), mean_ratio)
    sfs = SFS(profile, pred)
    if elapsed is not None:  # how far into the in-flight step, in multiples of its typical duration
        sfs.estimate(snap, Query(len(pred) - 1, 0.0, prompt))
        snap.infl_start = -elapsed * sfs.last_parts()[1]
    typ = np.zeros(10_000)
    total = sfs.estimate(snap, Query(len(pred) - 1, 0.0, prompt), typ)
    typ = typ[: sfs.last_steps].copy()
    known, typ0, e = sfs.last_parts()
    samples = np.empty(20_000)
    mc_ttft(known, typ, sfs.dist_scale, sfs.model.noise, sfs.model.stall_q, sfs.model.stall_v, sfs._cv, typ0, e,
            samples.size, rng_state(seed), samples)
    return sfs, total, samples


def _check_quantiles(sfs, samples, tol=0.02):
    d = sfs.last_dist(float(np.median(samples)))
    assert d.p50 < d.p90 < d.p99
    assert abs(samples.mean() - d.mean) / d.mean < 0.01  # the noise model's mean
    for level, v in ((0.5, d.p50), (0.9, d.p90), (0.99, d.p99)):
        assert abs(np.mean(samples <= v) - level) < tol, level
    assert abs(d.p_on_time - 0.5) < tol + 0.01
    return d


def test_quantiles_match_monte_carlo_with_stalls():
    sfs, total, samples = _case(0.05)
    d = _check_quantiles(sfs, samples)
    assert d.mean > total  # the jitter's mean and the conditional remainder exceed the expected-time charge


def test_p_on_time_matches_monte_carlo_across_slos():
    sfs, _, samples = _case(None, n=64)
    for s in np.quantile(samples, [0.05, 0.3, 0.7, 0.95]):
        assert abs(sfs.p_on_time(float(s)) - np.mean(samples <= s)) < 0.03


def test_common_factor_matches_monte_carlo_and_widens():
    sfs0, _, s0 = _case(0.02, common=0.0)
    sfs, _, samples = _case(0.02, common=0.02)
    d0, d = _check_quantiles(sfs0, s0), _check_quantiles(sfs, samples)
    assert d.p90 - d.p50 > 1.5 * (d0.p90 - d0.p50)  # shared noise does not average out
    assert abs(d.mean - d0.mean) / d0.mean < 1e-9  # mean 1: the mean stays


def test_mean_ratio_for_sums_scales_the_steps():
    sfs, _, samples = _case(0.02, mean_ratio=1.1)
    d = _check_quantiles(sfs, samples)
    known, typ0, e = sfs.last_parts()
    assert sfs.dist_scale == pytest.approx(1.1 / sfs._nm[0])
    rem, _ = remainder_moments(sfs.dist_scale * typ0, e, sfs._nm)
    assert d.mean == pytest.approx(known + rem + 1.1 * sfs.last_s1, rel=1e-12)  # each step's mean: 1.1 x typical


def test_overrunning_in_flight_step_matches_monte_carlo():
    # 1.1x its typical time already elapsed: the point estimate charges no remainder, a still running step has one
    # (further out only a stall keeps it running and its remainder, the stall quantiles' piecewise-uniform excess,
    # is no lognormal: at 1.3x the p50 is off by 4.6 points, the p90 by 2.7)
    sfs, total, samples = _case(0.05, elapsed=1.1)
    known, typ0, e = sfs.last_parts()
    assert e > typ0 * sfs.model.mult
    d = _check_quantiles(sfs, samples, tol=0.03)
    assert d.mean > total + 0.1 * typ0


def test_remainder_moments_against_sampling():
    sfs, _, _ = _case(0.05)
    rng = np.random.default_rng(3)
    r = sfs.profile.noise.sample_ratio(rng, 2_000_000)
    for a in (0.2, 0.9, 1.05, 1.5):
        left = r[r > a] - a
        m, v = remainder_moments(1.0, a, sfs._nm)
        assert abs(m - left.mean()) < 0.03 * left.mean() + 1e-3, a
        assert abs(np.sqrt(v) - left.std()) < 0.15 * left.std() + 1e-3, a


def test_no_noise_is_a_point_mass():
    sfs, total, _ = _case(None)
    sfs._nm = sfs._nm.copy()
    sfs._nm[2] = sfs._nm[3] = sfs._nm[7] = 0.0  # no jitter, no stalls
    d = sfs.last_dist(total)
    assert d.p50 == d.p99 == d.mean and d.p_on_time == (1.0 if d.mean <= total else 0.0)
    assert sfs.p_on_time(d.mean * 0.999) == 0.0 and sfs.p_on_time(d.mean) == 1.0
