"""SFS's TTFT as a distribution (DESIGN section 8).

Along SFS's trajectory the query's TTFT is D + sum_k c * tau_k * r_k: D the
known part (the in-flight step's remainder, the inter-step gaps, the front
end's overhead), tau_k the typical duration of simulated step k, r_k the
profile's noise ratio (lognormal jitter, plus with probability p_stall an
excess drawn from the stall quantiles) and c = mult / E[r], so the mean is
exactly SFS's point estimate (and a host-speed factor scales the spread too).

Why analytic, not Monte Carlo: the kernel already walks the trajectory, so
two extra accumulators (sum tau, sum tau^2) are all it needs; the rest is a
mixture over the number of stalls K ~ Binomial(n, p) whose components are
Fenton-Wilkinson lognormals (jitter sum plus k stall excesses, moments
matched). A few erfc calls replace hundreds of noise draws per estimate, and
``tests/test_sfs_dist.py`` / ``latroute bench --only sfs`` check it against a
brute-force Monte Carlo on the twin's own noise draws with the trajectory
fixed.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from estimators.engine.timing import TimeModel, noisy_ratio

LEVELS = (0.5, 0.9, 0.99)
_Z = np.array([0.0, 1.2815515655446004, 2.3263478740408408])  # standard normal quantiles of LEVELS
MAX_STALLS = 24  # mixture components; the binomial tail beyond is lumped into the last
_SQRT2 = math.sqrt(2.0)


class NoiseMoments(NamedTuple):
    """The noise model's moments the mixture needs (per model, computed once)."""

    mean_ratio: float  # E[r]
    jit_mean: float  # E[exp(mu + sigma Z)]
    jit_var: float
    p_stall: float
    ex_mean: float  # E[X], X the stall excess (multiples of typical)
    ex_m2: float  # E[X^2]


def noise_moments(model: TimeModel) -> NoiseMoments:
    mu, sig, p, ex_mean = (float(x) for x in model.noise[:4])
    jm = math.exp(mu + 0.5 * sig * sig)
    jv = math.exp(2 * mu + sig * sig) * (math.exp(sig * sig) - 1.0)
    if model.stall_q.size >= 2:  # X = interp(U, q, v): moments by a fine grid over U
        u = (np.arange(20000) + 0.5) / 20000
        x = np.interp(u, model.stall_q, model.stall_v)
        ex_mean, ex_m2 = float(x.mean()), float((x * x).mean())
    else:
        ex_m2 = ex_mean * ex_mean
    return NoiseMoments(jm + p * ex_mean, jm, jv, p, ex_mean, ex_m2)


class TTFTDist(NamedTuple):
    mean: float
    p50: float
    p90: float
    p99: float
    p_on_time: float  # P(TTFT <= SLO)


@njit(cache=True)
def _components(s1, s2, n, c, nm, w, mu, sg):
    """Stall-count mixture: weights ``w``, lognormal (mu, sigma) of the
    random part per number of stalls k. Returns the component count."""
    jit_m, jit_v, p, ex_m, ex_m2 = nm[1], nm[2], nm[3], nm[4], nm[5]
    m_j = c * jit_m * s1
    v_j = c * c * jit_v * s2
    tau_m = s1 / n
    tau_m2 = s2 / n
    y_m = c * tau_m * ex_m
    y_v = c * c * (tau_m2 * ex_m2 - tau_m * tau_m * ex_m * ex_m)
    if y_v < 0.0:
        y_v = 0.0
    kmax = MAX_STALLS if p > 0.0 else 0
    if kmax > n:
        kmax = n
    wk = (1.0 - p) ** n
    cum = 0.0
    nc = 0
    for k in range(kmax + 1):
        if k > 0:
            wk *= (n - k + 1) / k * p / (1.0 - p)
        w[k] = wk
        cum += wk
        m = m_j + k * y_m
        v = v_j + k * y_v
        s2k = math.log1p(v / (m * m)) if m > 0.0 else 0.0
        sg[k] = math.sqrt(s2k)
        mu[k] = math.log(m) - 0.5 * s2k if m > 0.0 else -np.inf
        nc = k + 1
        if cum >= 1.0 - 1e-7 and k >= 1:
            break
    w[nc - 1] += 1.0 - cum  # the tail beyond, lumped into the last component
    return nc


@njit(cache=True)
def _cdf(x, w, mu, sg, nc):
    """P(random part <= x) under the mixture."""
    if x <= 0.0:
        return 0.0
    lx = math.log(x)
    out = 0.0
    for k in range(nc):
        if sg[k] > 0.0:
            out += w[k] * 0.5 * math.erfc(-(lx - mu[k]) / (sg[k] * _SQRT2))
        elif lx >= mu[k]:
            out += w[k]
    return out


@njit(cache=True)
def _mix_quantile(q, lo, hi, w, mu, sg, nc):
    """log x with P(random part <= x) = q, x bracketed in [lo, hi] (log
    space): Newton on the mixture's log-space CDF, bisecting whenever a step
    leaves the bracket."""
    x = 0.5 * (lo + hi)
    for _ in range(60):
        f = -q
        df = 0.0
        for k in range(nc):
            if sg[k] > 0.0:
                z = (x - mu[k]) / sg[k]
                f += w[k] * 0.5 * math.erfc(-z / _SQRT2)
                df += w[k] * math.exp(-0.5 * z * z) / (sg[k] * 2.5066282746310002)
            elif x >= mu[k]:
                f += w[k]
        if f < 0.0:
            lo = x
        else:
            hi = x
        nx = x - f / df if df > 0.0 else 0.5 * (lo + hi)
        if not (lo < nx < hi):
            nx = 0.5 * (lo + hi)
        if abs(nx - x) < 1e-7 or hi - lo < 1e-7:
            return nx
        x = nx
    return x


@njit(cache=True)
def ttft_dist(total, s1, s2, n, mult, nm, slo, quantiles, out):
    """``out`` <- [mean, p50, p90, p99, P(TTFT <= slo)] for SFS's estimate
    ``total`` whose simulated steps have typical sums ``s1``, ``s2`` over
    ``n`` steps; ``nm`` = NoiseMoments as an array. ``quantiles`` False:
    only the mean and P(TTFT <= slo) (what a router needs)."""
    out[0] = total
    if not np.isfinite(total):
        out[1] = out[2] = out[3] = np.inf
        out[4] = 0.0
        return
    c = mult / nm[0]
    rand_mean = c * nm[0] * s1
    d = total - rand_mean  # the known part
    if n == 0 or s1 <= 0.0 or (nm[2] == 0.0 and nm[3] == 0.0):
        out[1] = out[2] = out[3] = total
        out[4] = 1.0 if total <= slo else 0.0
        return
    w = np.empty(MAX_STALLS + 1)
    mu = np.empty(MAX_STALLS + 1)
    sg = np.empty(MAX_STALLS + 1)
    nc = _components(s1, s2, n, c, nm, w, mu, sg)
    out[4] = _cdf(slo - d, w, mu, sg, nc)
    if not quantiles:
        return
    for li in range(3):
        q = (0.5, 0.9, 0.99)[li]
        # a mixture's quantile lies between its components' quantiles
        lo = np.inf
        hi = -np.inf
        for k in range(nc):
            z = mu[k] + sg[k] * _Z[li]
            lo = min(lo, z)
            hi = max(hi, z)
        if nc == 1:
            out[1 + li] = d + math.exp(lo)
            continue
        out[1 + li] = d + math.exp(_mix_quantile(q, lo, hi, w, mu, sg, nc))


@njit(cache=True)
def mc_ttft(total, typ, mult, mean_ratio, noise, stall_q, stall_v, draws, rng, out):
    """Brute force with the trajectory fixed: ``draws`` TTFTs whose steps
    take the twin's own noise draws (``noisy_ratio``), into ``out``."""
    c = mult / mean_ratio
    s1 = 0.0
    for k in range(typ.size):
        s1 += typ[k]
    d = total - mult * s1
    for i in range(draws):
        t = d
        for k in range(typ.size):
            t += c * typ[k] * noisy_ratio(noise, stall_q, stall_v, rng)
        out[i] = t


def as_array(nm: NoiseMoments) -> np.ndarray:
    return np.array(nm, dtype=np.float64)
