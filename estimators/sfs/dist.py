"""SFS's TTFT as a distribution (docs/concepts/estimators.md), kept as one piece past 400
lines: the mixture's components, its CDF, quantiles and the fused P(on
time) share one layout of the components and must change together.

Along SFS's trajectory the query's TTFT is D + R + F * sum_k c * tau_k * r_k:
D the known part (the inter-step gaps, the request intake, the front end's
overhead), tau_k the typical duration of simulated step k, r_k the profile's
noise ratio (lognormal jitter, plus with probability p_stall an excess drawn
from the stall quantiles), c the host-speed factor (1 unless online speed
correction is on), R the in-flight step's remainder and F a common factor.

- Each step's duration is the noise model's, as the twin draws it
  (``typical * noisy_ratio``), so the distribution's mean is
  c * E[r] * sum tau, not SFS's point estimate: that one charges the
  expected time, typical * (1 + p_stall * stall excess), the paper's rule
  (its MAPE figures stand), while the noise model's mean also holds the
  jitter's offset exp(log_mu + sigma^2 / 2); on the vllm_cpu profiles the
  two differ by 3-23%, and centring the spread on the point estimate put
  the p50 that much too low.
- R is the remainder of a step known to be still running after ``elapsed``:
  E[D_0 - e | D_0 > e] under the noise model (the inspection paradox: a
  step an arrival falls into is a long one), with its variance, not the
  point estimate's max(expected - elapsed, 0).
- F (lognormal, mean 1) carries what the trajectory's steps share
  (``estimators.timemodel.step_correlation``): step noise is strongly correlated on
  real hosts, so a short trajectory keeps nearly one step's spread.

Why analytic, not Monte Carlo: the kernel already walks the trajectory, so
two extra accumulators (sum tau, sum tau^2) are all it needs; the rest is a
mixture over the number of stalls K ~ Binomial(n, p) whose components are
Fenton-Wilkinson lognormals (jitter sum plus k stall excesses times F, plus
R, moments matched). A few erfc calls replace hundreds of noise draws per
estimate, and ``tests/estimators/sfs/test_sfs_dist.py`` / ``latroute bench --only sfs``
check it against a brute-force Monte Carlo on the twin's own noise draws
with the trajectory fixed.

The noise draws and the step-time model are the engine's
(``estimators.engine.timing``: plain arrays; a fitted profile becomes a
``TimeModel`` in ``estimators.timemodel.kernel_form``). Numba's on-disk cache of this
module is keyed by this file's own stamp, not by the engine's: a change to
the engine's timing that keeps its signatures needs this file touched too.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
from numba import njit

from estimators.engine.timing import TimeModel, noisy_ratio, rng_normal
from estimators.timemodel.step_correlation import GRID

LEVELS = (0.5, 0.9, 0.99)
_Z = np.array([0.0, 1.2815515655446004, 2.3263478740408408])  # standard normal quantiles of LEVELS
N_EXCESS = 8  # points of the stall excess in the in-flight remainder
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
    log_mu: float
    log_sigma: float
    # the stall excess at the midpoints of N_EXCESS equal-probability bins (the in-flight remainder's stall branch)
    excess_points: tuple = ()


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
    pts = (np.interp((np.arange(N_EXCESS) + 0.5) / N_EXCESS, model.stall_q, model.stall_v)
           if model.stall_q.size >= 2 else np.full(N_EXCESS, ex_mean))
    return NoiseMoments(jm + p * ex_mean, jm, jv, p, ex_mean, ex_m2, mu, sig, tuple(float(x) for x in pts))


class TTFTDist(NamedTuple):
    mean: float
    p50: float
    p90: float
    p99: float
    p_on_time: float  # P(TTFT <= SLO)


@njit(cache=True)
def _components(s1, s2, n, c, nm, f2, rw, rm, rv, w, mu, sg):
    """Mixture over the number of stalls k among the simulated steps and the
    in-flight remainder's branch b: weights ``w``, lognormal (mu, sigma) of
    the random part (the steps' sum times a common factor of second moment
    ``f2``, plus the remainder's branch b, independent). Returns the
    component count."""
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
        cum += wk
        m_s = m_j + k * y_m
        v_s = f2 * (v_j + k * y_v + m_s * m_s) - m_s * m_s  # F times the steps' sum
        for b in range(2):
            if rw[b] <= 0.0:
                continue
            w[nc] = wk * rw[b]
            m = m_s + rm[b]
            v = v_s + rv[b]
            s2k = math.log1p(v / (m * m)) if m > 0.0 else 0.0
            sg[nc] = math.sqrt(s2k)
            mu[nc] = math.log(m) - 0.5 * s2k if m > 0.0 else -np.inf
            nc += 1
        if cum >= 1.0 - 1e-7 and k >= 1:
            break
    tail = 1.0 - cum  # the binomial tail beyond, lumped into the last stall count's components
    j = nc - 1
    for b in range(1, -1, -1):
        if rw[b] > 0.0:
            w[j] += tail * rw[b]
            j -= 1
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
def _mix_quantile(q, x, lo, hi, w, mu, sg, nc):
    """log x with P(random part <= x) = q, x bracketed in [lo, hi] (log
    space): Newton on the mixture's log-space CDF from ``x`` (the components'
    quantiles averaged by weight: near the answer, so a few steps do),
    bisecting whenever a step leaves the bracket."""
    if not (lo < x < hi):
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
def common_var(n, cv):
    """The log variance a trajectory of ``n`` steps shares (``cv`` at
    ``step_correlation.GRID``; linear between, 1/n past the last point)."""
    if n <= 1.0:
        return 0.0
    last = GRID.size - 1
    if n >= GRID[last]:
        return cv[last] * GRID[last] / n
    i = 1
    while GRID[i] < n:
        i += 1
    f = (n - GRID[i - 1]) / (GRID[i] - GRID[i - 1])
    return cv[i - 1] + f * (cv[i] - cv[i - 1])


@njit(cache=True)
def _tail(a, shift, mu, sig):
    """For J = exp(mu + sig Z) and Y = J + shift: P(Y > a), E[(Y - a) 1{Y > a}],
    E[(Y - a)^2 1{Y > a}]."""
    b = a - shift
    jm = math.exp(mu + 0.5 * sig * sig)
    j2 = math.exp(2.0 * mu + 2.0 * sig * sig)
    if b <= 0.0:
        d = shift - a
        return 1.0, jm + d, j2 + 2.0 * d * jm + d * d
    lb = math.log(b)
    if sig <= 0.0:
        y = math.exp(mu) - b
        return (1.0, y, y * y) if y > 0.0 else (0.0, 0.0, 0.0)
    p = 0.5 * math.erfc(-(mu - lb) / (sig * _SQRT2))
    e1 = jm * 0.5 * math.erfc(-(mu + sig * sig - lb) / (sig * _SQRT2))
    e2 = j2 * 0.5 * math.erfc(-(mu + 2.0 * sig * sig - lb) / (sig * _SQRT2))
    m1 = max(e1 - b * p, 0.0)
    return p, m1, max(e2 - 2.0 * b * e1 + b * b * p, 0.0)


@njit(cache=True)
def remainder_branches(u, e, nm, rw, rm, rv):
    """The remainder R = u r - e given u r > e, r the noise ratio (``nm``:
    NoiseMoments as an array), u = c * typical of the in-flight step, e its
    elapsed time: the remainder of a step known to be still running, as
    two branches (no stall, stall: a still running step is more likely a
    stalled one), their probabilities given it still runs in ``rw``, means
    in ``rm``, variances in ``rv``. The stall excess is taken at
    ``N_EXCESS`` points of equal probability."""
    rw[0], rw[1] = 1.0, 0.0
    rm[0] = rm[1] = rv[0] = rv[1] = 0.0
    if u <= 0.0:
        return
    a = e / u
    mu, sig, p = nm[6], nm[7], nm[3]
    p0, m0, s0 = _tail(a, 0.0, mu, sig)
    p1 = m1 = s1 = 0.0
    if p > 0.0:
        for i in range(N_EXCESS):
            pi, mi, si = _tail(a, nm[8 + i], mu, sig)
            p1 += pi / N_EXCESS
            m1 += mi / N_EXCESS
            s1 += si / N_EXCESS
    alive = (1.0 - p) * p0 + p * p1
    if alive < 1e-12:  # far past anything the model expects: the lognormal's mean residual life
        m = a * sig * sig / max(math.log(a) - mu, sig) if a > 0.0 else 0.0
        rm[0], rv[0] = u * m, (u * m) ** 2
        return
    rw[1] = p * p1 / alive
    rw[0] = 1.0 - rw[1]
    for b, pb, mb, sb in ((0, p0, m0, s0), (1, p1, m1, s1)):
        if pb > 0.0:
            rm[b] = u * mb / pb
            rv[b] = u * u * max(sb / pb - (mb / pb) ** 2, 0.0)


def remainder_moments(u: float, e: float, nm: np.ndarray) -> tuple[float, float]:
    """Mean and variance of the in-flight remainder (both branches of
    ``remainder_branches`` together)."""
    rw, rm, rv = np.zeros(2), np.zeros(2), np.zeros(2)
    remainder_branches(u, e, nm, rw, rm, rv)
    m = float(rw @ rm)
    return m, float(rw @ (rv + rm * rm) - m * m)


@njit(cache=True)
def _dist_head(known, s1, s2, n, c, nm, cv, rw, rm, rv, n_traj, slo, out, w, mu, sg):
    """``ttft_dist`` up to its quantiles: ``out[0]`` (the mean) and
    ``out[4]`` (P(TTFT <= slo)), the mixture's components into the scratch
    ``w``, ``mu``, ``sg`` (``2 * (MAX_STALLS + 1)`` each). Returns their
    count, or -1 when the distribution is a point or not finite (``out``
    then complete). Allocates nothing: ``sfs_estimate_p`` calls it
    without Numba's runtime."""
    if not np.isfinite(known):
        out[0] = out[1] = out[2] = out[3] = np.inf
        out[4] = 0.0
        return -1
    out[0] = known + rw[0] * rm[0] + rw[1] * rm[1] + c * nm[0] * s1
    f2 = math.exp(common_var(n_traj, cv))  # E[F^2]
    if ((n == 0 or s1 <= 0.0 or (nm[2] == 0.0 and nm[3] == 0.0 and f2 == 1.0))
            and rv[0] == 0.0 and rv[1] == 0.0 and rw[1] == 0.0):
        out[1] = out[2] = out[3] = out[0]
        out[4] = 1.0 if out[0] <= slo else 0.0
        return -1
    nc = _components(max(s1, 0.0), max(s2, 0.0), max(n, 1), c, nm, f2, rw, rm, rv, w, mu, sg)
    out[4] = _cdf(slo - known, w, mu, sg, nc)
    return nc


@njit(cache=True)
def ttft_dist(known, s1, s2, n, c, nm, cv, rw, rm, rv, n_traj, slo, quantiles, out):
    """``out`` <- [mean, p50, p90, p99, P(TTFT <= slo)] of known + R + F *
    sum_k c tau_k r_k, the ``n`` simulated steps' typical durations summing
    to ``s1`` (squares ``s2``); R in branches (``remainder_branches``: all
    zeros when no step is in flight); F of log variance
    ``common_var(n_traj, cv)``. ``quantiles`` False: only the mean and
    P(TTFT <= slo) (what a router needs)."""
    size = 2 * (MAX_STALLS + 1)
    w = np.empty(size)
    mu = np.empty(size)
    sg = np.empty(size)
    nc = _dist_head(known, s1, s2, n, c, nm, cv, rw, rm, rv, n_traj, slo, out, w, mu, sg)
    if nc < 0 or not quantiles:
        return
    for li in range(3):
        q = (0.5, 0.9, 0.99)[li]
        # a mixture's quantile lies between its components' quantiles
        lo = np.inf
        hi = -np.inf
        x0 = 0.0
        for k in range(nc):
            z = mu[k] + sg[k] * _Z[li]
            lo = min(lo, z)
            hi = max(hi, z)
            x0 += w[k] * z
        if nc == 1:
            out[1 + li] = known + math.exp(lo)
            continue
        out[1 + li] = known + math.exp(_mix_quantile(q, x0, lo, hi, w, mu, sg, nc))


@njit(cache=True)
def sfs_ttft_dist(total, s1, s2, n, mult, c, nm, cv, typ0, elapsed, slo, quantiles, out):
    """The distribution of SFS's estimate ``total`` (seconds, as returned:
    gaps, intake and overhead included) whose simulated steps have typical
    sums ``s1``, ``s2`` over ``n`` steps, charged ``mult`` times typical;
    the in-flight step, of typical duration ``typ0`` (0: none; SFS returns
    it), started ``elapsed`` ago. The point estimate charged it
    max(typical * mult - elapsed, 0) and each simulated step typical * mult:
    both are replaced by their random counterparts (``ttft_dist``)."""
    rw = np.zeros(2)
    rm = np.zeros(2)
    rv = np.zeros(2)
    rw[0] = 1.0
    n_traj = float(n)
    if typ0 > 0.0:
        remainder_branches(c * typ0, elapsed, nm, rw, rm, rv)
        n_traj += 1.0
    ttft_dist(known_part(total, s1, mult, typ0, elapsed), s1, s2, n, c, nm, cv, rw, rm, rv, n_traj, slo, quantiles,
              out)


SCRATCH_ROWS, SCRATCH_COLS = 7, 2 * (MAX_STALLS + 1)  # sfs_p_on_time's scratch: w, mu, sg, rw, rm, rv, out


@njit(cache=True)
def sfs_p_on_time(total, s1, s2, n, mult, c, nm, cv, typ0, elapsed, slo, buf):
    """``sfs_ttft_dist(..., quantiles=False, out)``'s ``out[4]`` (the same
    arithmetic), allocating nothing: its arrays are rows of ``buf``
    (``SCRATCH_ROWS`` x ``SCRATCH_COLS``; row 6 receives ``out``)."""
    rw, rm, rv, out = buf[3], buf[4], buf[5], buf[6]
    rw[0], rw[1] = 1.0, 0.0
    rm[0] = rm[1] = rv[0] = rv[1] = 0.0
    n_traj = float(n)
    if typ0 > 0.0:
        remainder_branches(c * typ0, elapsed, nm, rw, rm, rv)
        n_traj += 1.0
    _dist_head(known_part(total, s1, mult, typ0, elapsed), s1, s2, n, c, nm, cv, rw, rm, rv, n_traj, slo, out,
               buf[0], buf[1], buf[2])
    return out[4]


@njit(cache=True)
def known_part(total, s1, mult, typ0, elapsed):
    """What SFS's estimate ``total`` holds besides the random parts: less
    the in-flight step's charge (max(typical * mult - elapsed, 0); none
    when ``typ0`` is 0) and the simulated steps' (mult * their typical sum)."""
    rem_point = max(typ0 * mult - elapsed, 0.0) if typ0 > 0.0 else 0.0
    return total - rem_point - mult * s1


@njit(cache=True)
def mc_ttft(known, typ, c, noise, stall_q, stall_v, cv, typ0, elapsed, draws, rng, out):
    """Brute force with the trajectory fixed: ``draws`` TTFTs into ``out``,
    each ``known`` + the in-flight step's remainder (its duration
    c * typ0 * ratio drawn until it exceeds ``elapsed``; none if typ0 = 0) +
    a common lognormal factor (log variance from ``cv``, mean 1) times the
    steps ``c * typ[k] * ratio``, every ratio the twin's own noise draw
    (``noisy_ratio``)."""
    n_traj = typ.size + (1 if typ0 > 0.0 else 0)
    v = common_var(float(n_traj), cv)
    for i in range(draws):
        t = known
        if typ0 > 0.0:
            for _ in range(100_000):
                d = c * typ0 * noisy_ratio(noise, stall_q, stall_v, rng)
                if d > elapsed:
                    t += d - elapsed
                    break
        f = math.exp(-0.5 * v + math.sqrt(v) * rng_normal(rng))
        for k in range(typ.size):
            t += f * c * typ[k] * noisy_ratio(noise, stall_q, stall_v, rng)
        out[i] = t


def as_array(nm: NoiseMoments) -> np.ndarray:
    return np.array([*nm[:8], *nm.excess_points], dtype=np.float64)
