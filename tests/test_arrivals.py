"""Statistical checks of the arrival processes (the paper's setup, docs/results/paper.md)."""
from __future__ import annotations

import numpy as np
import pytest

from traces.workload.arrivals import ArrivalSpec, generate_arrivals, mmpp_path


def dispersion_index(times: np.ndarray, window: float) -> float:
    """Variance / mean of arrival counts in consecutive windows (1 for Poisson)."""
    counts = np.bincount((times // window).astype(np.int64))[:-1]  # drop the partial last window
    return counts.var() / counts.mean()


def test_poisson_rate_and_dispersion():
    t = generate_arrivals(ArrivalSpec("poisson", rate=8.0), np.random.default_rng(1), n=100_000)
    assert t.size == 100_000 and np.all(np.diff(t) >= 0)
    rate = (t.size - 1) / (t[-1] - t[0])
    assert abs(rate / 8.0 - 1) < 0.03
    assert 0.9 < dispersion_index(t, 1.0) < 1.1


def test_poisson_by_duration():
    t = generate_arrivals(ArrivalSpec("poisson", rate=5.0), np.random.default_rng(2), duration=4000.0)
    assert t.max() < 4000.0
    assert abs(t.size / 4000.0 / 5.0 - 1) < 0.03


@pytest.mark.parametrize("ratio", [3.0, 6.0])
def test_mmpp_recovers_state_fraction_and_rate_ratio(ratio):
    spec = ArrivalSpec("mmpp", rate=7.0, burst_ratio=ratio, high_fraction=0.2, correlation_s=2.0)
    path = mmpp_path(spec, np.random.default_rng(3), n=200_000)
    end = path.times[-1]
    inside = path.starts < end
    states, starts = path.states[inside], path.starts[inside]
    lengths = np.minimum(path.lengths[inside], end - starts)
    t_high = lengths[states == 1].sum()
    t_low = lengths[states == 0].sum()
    assert abs(t_high / (t_high + t_low) / 0.2 - 1) < 0.10
    # arrivals by the state they fell in
    idx = np.searchsorted(starts, path.times, side="right") - 1
    in_high = states[idx] == 1
    ratio_hat = (in_high.sum() / t_high) / ((~in_high).sum() / t_low)
    assert abs(ratio_hat / ratio - 1) < 0.10
    # mean rate is the requested one and counts are over-dispersed
    assert abs(path.times.size / end / 7.0 - 1) < 0.05
    assert dispersion_index(path.times, 1.0) > 1.5


@pytest.mark.parametrize("burstiness", [0.25, 0.5, 2.0, 4.0])
def test_gamma_cv2(burstiness):
    t = generate_arrivals(ArrivalSpec("gamma", rate=6.0, burstiness=burstiness), np.random.default_rng(4), n=100_000)
    gaps = np.diff(t)
    cv2 = gaps.var() / gaps.mean() ** 2
    assert abs(cv2 * burstiness - 1) < 0.10
    assert abs(1 / gaps.mean() / 6.0 - 1) < 0.03


def test_same_seed_same_arrivals_and_bad_specs():
    spec = ArrivalSpec("mmpp", rate=4.0)
    a = generate_arrivals(spec, np.random.default_rng(9), n=1000)
    b = generate_arrivals(spec, np.random.default_rng(9), n=1000)
    assert np.array_equal(a, b)
    with pytest.raises(ValueError):
        generate_arrivals(ArrivalSpec("mmpp", rate=4.0, high_fraction=1.5), np.random.default_rng(0), n=10)
    with pytest.raises(ValueError):
        generate_arrivals(ArrivalSpec("weibull", rate=4.0), np.random.default_rng(0), n=10)
    with pytest.raises(ValueError):
        generate_arrivals(spec, np.random.default_rng(0))
