"""Arrival processes for synthetic workloads.

- ``poisson``: exponential inter-arrivals at rate R.
- ``gamma``: Gamma inter-arrivals with shape = burstiness and scale =
  1/(R*burstiness), exactly as ``vllm bench serve`` draws them; the
  inter-arrival CV^2 is 1/burstiness (burstiness 1 is Poisson). As in
  ``vllm bench serve``, a burstiness other than 1 with no arrival process
  named means gamma (``resolve_arrival``); a process that cannot honour it
  is refused rather than silently ignoring it.
- ``mmpp``: a two-state Markov-modulated Poisson process with mean rate R,
  rate ratio r = high/low, high-state time fraction f and correlation time c
  (the state process's autocorrelation decays as exp(-t/c)), so the switching
  rates are low->high = f/c and high->low = (1-f)/c.
- ``azure-conv``: the Azure conversation trace's hour-long arrival shape
  (per-10 s intensity) at mean rate R, Poisson within each 10 s
  (``traces.workload.azure_shape``): an hour of real-shaped traffic at fleet rates.

All generators are vectorised (a 1M-request trace takes well under a second)
and take either a request count or a duration.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.workload.azure_shape import shaped_arrivals

ARRIVAL_KINDS = ("poisson", "mmpp", "gamma", "azure-conv")
# gamma shape (burstiness) accepted: CV^2 from 100 down to 0.01; beyond, the draws degenerate (a shape of
# 1e-300 gives gaps of 0 and one gap of the whole run). harness.cli.params.BURSTINESS states the same range.
BURSTINESS_RANGE = (0.01, 100.0)


def _burstiness_error(burstiness: float) -> str | None:
    lo, hi = BURSTINESS_RANGE
    if not lo <= burstiness <= hi:  # NaN fails too
        return f"must be in [{lo:g}, {hi:g}] (inter-arrival CV^2 = 1/burstiness), got {burstiness:g}"
    return None


@dataclass(frozen=True)
class ArrivalSpec:
    kind: str = "poisson"
    rate: float = 8.0  # mean requests per second
    burst_ratio: float = 3.0  # mmpp: high-state rate / low-state rate
    high_fraction: float = 0.2  # mmpp: share of time in the high state
    correlation_s: float = 2.0  # mmpp: correlation time of the state process
    burstiness: float = 1.0  # gamma: shape parameter

    def check(self) -> None:
        if self.kind not in ARRIVAL_KINDS:
            raise ValueError(f"unknown arrival process {self.kind!r} (choose from {', '.join(ARRIVAL_KINDS)})")
        if not 1e-3 <= self.rate <= 1e9:  # as harness.cli.params.POSITIVE (NaN fails too)
            raise ValueError(f"rate must be in [0.001, 1e9] requests/s, got {self.rate:g}")
        if self.kind == "mmpp":
            if not self.burst_ratio >= 1:
                raise ValueError("burst ratio must be >= 1")
            if not 0 < self.high_fraction < 1:
                raise ValueError("high fraction must be in (0, 1)")
            if not self.correlation_s > 0:
                raise ValueError("correlation time must be > 0")
        if self.kind == "gamma" and (why := _burstiness_error(self.burstiness)) is not None:
            raise ValueError(f"burstiness {why}")

    def mmpp_rates(self) -> tuple[float, float]:
        """(low, high) state rates whose time-average is ``rate``."""
        low = self.rate / (1.0 + self.high_fraction * (self.burst_ratio - 1.0))
        return low, low * self.burst_ratio


def resolve_arrival(kind: str | None, burstiness: float) -> str:
    """The arrival process for ``--arrival`` (None: not given) and
    ``--burstiness``: unnamed means gamma when burstiness != 1, else
    Poisson; a named process other than gamma takes only burstiness 1."""
    if (why := _burstiness_error(burstiness)) is not None:
        raise ValueError(why)
    if kind is None:
        return "gamma" if burstiness != 1.0 else "poisson"
    if kind not in ARRIVAL_KINDS:
        raise ValueError(f"unknown arrival process {kind!r} (choose from {', '.join(ARRIVAL_KINDS)})")
    if kind != "gamma" and burstiness != 1.0:
        raise ValueError(f"{burstiness:g} needs gamma arrivals ({kind} cannot honour a burstiness other than 1)")
    return kind


def _renewal(rng: np.random.Generator, draw, mean_gap: float, n: int | None, duration: float | None) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps, first arrival at the first gap."""
    if n is not None:
        return np.cumsum(draw(n))
    out: list[np.ndarray] = []
    t = 0.0
    block = max(1024, int(duration / mean_gap * 1.1) + 16)
    while t < duration:
        times = t + np.cumsum(draw(block))
        out.append(times)
        t = float(times[-1])
    times = np.concatenate(out)
    return times[times < duration]


@dataclass
class MMPPPath:
    """A realised MMPP-2: arrival times plus the state sojourns behind them."""

    times: np.ndarray
    states: np.ndarray  # per sojourn: 1 = high, 0 = low
    starts: np.ndarray  # per sojourn start time
    lengths: np.ndarray  # per sojourn duration


def mmpp_path(spec: ArrivalSpec, rng: np.random.Generator, n: int | None = None,
              duration: float | None = None) -> MMPPPath:
    low, high = spec.mmpp_rates()
    mean_low = spec.correlation_s / spec.high_fraction  # sojourn in low: 1 / (f/c)
    mean_high = spec.correlation_s / (1.0 - spec.high_fraction)  # sojourn in high: 1 / ((1-f)/c)
    state = int(rng.random() < spec.high_fraction)  # start in the stationary distribution
    horizon = duration if duration is not None else n / spec.rate * 1.2 + 10 * (mean_low + mean_high)
    chunks: list[np.ndarray] = []
    st_parts: list[np.ndarray] = []
    start_parts: list[np.ndarray] = []
    len_parts: list[np.ndarray] = []
    t0 = 0.0
    count = 0
    while True:
        k = max(64, int(horizon / (mean_low + mean_high)) * 2 + 8)
        states = (state + np.arange(k)) % 2
        sojourn = rng.exponential(np.where(states == 1, mean_high, mean_low))
        starts = t0 + np.concatenate(([0.0], np.cumsum(sojourn[:-1])))
        counts = rng.poisson(np.where(states == 1, high, low) * sojourn)
        times = np.repeat(starts, counts) + rng.random(counts.sum()) * np.repeat(sojourn, counts)
        times.sort()
        chunks.append(times)
        st_parts.append(states)
        start_parts.append(starts)
        len_parts.append(sojourn)
        count += times.size
        t0 = float(starts[-1] + sojourn[-1])
        state = int((states[-1] + 1) % 2)
        if (n is not None and count >= n) or (duration is not None and t0 >= duration):
            break
    times = np.concatenate(chunks)
    times = times[:n] if n is not None else times[times < duration]
    return MMPPPath(times, np.concatenate(st_parts), np.concatenate(start_parts), np.concatenate(len_parts))


def generate_arrivals(spec: ArrivalSpec, rng: np.random.Generator, n: int | None = None,
                      duration: float | None = None) -> np.ndarray:
    """Arrival times in seconds (sorted, starting near 0)."""
    spec.check()
    if (n is None) == (duration is None):
        raise ValueError("give exactly one of a request count or a duration")
    if spec.kind == "poisson":
        return _renewal(rng, lambda k: rng.exponential(1.0 / spec.rate, k), 1.0 / spec.rate, n, duration)
    if spec.kind == "gamma":
        shape, scale = spec.burstiness, 1.0 / (spec.rate * spec.burstiness)
        return _renewal(rng, lambda k: rng.gamma(shape, scale, k), 1.0 / spec.rate, n, duration)
    if spec.kind == "azure-conv":
        return shaped_arrivals(spec.rate, rng, n, duration)
    return mmpp_path(spec, rng, n, duration).times


def source_arrivals(path) -> np.ndarray:
    """The arrival times of a trace given to ``--arrivals-from``, refused
    (BadInput naming the row) when any is unknown: a trace imported without
    send times (meta.json ``arrivals: unknown``, null ``arrival_s``) has no
    arrivals to reuse, and copying its nulls would write NaN arrivals."""
    from traces.store import open_trace

    trace = open_trace(path)
    times = trace.read("requests")["arrival_s"].to_numpy(dtype=np.float64)
    _refuse_unknown(trace, times, f"(null; meta.json arrivals: {trace.meta.get('arrivals', '?')}): nothing to take "
                                  "arrivals from")
    return times


def _refuse_unknown(trace, times: np.ndarray, why: str) -> None:
    """BadInput naming the first request whose arrival time is unknown (NaN)."""
    from traces.errors import BadInput

    unknown = np.flatnonzero(np.isnan(times))
    if unknown.size:
        raise BadInput(trace.file("requests"), int(unknown[0]) + 1, "arrival_s",
                       f"{unknown.size} of {times.size} arrival times are unknown {why}")


def check_replay_arrivals(trace, requests=None) -> None:
    """Refuse (BadInput naming the row) a trace whose arrivals the twin
    cannot replay: unknown (null) or out of order. ``replay``/``sweep
    --trace`` call it before any work."""
    from traces.errors import BadInput

    reqs = trace.read("requests", ["arrival_s"]) if requests is None else requests
    times = reqs["arrival_s"].to_numpy(dtype=np.float64)
    _refuse_unknown(trace, times, "(null): a replay needs them (generate a workload with --rate, or `trace "
                                  "generate --lengths-from` this trace)")
    back = np.flatnonzero(np.diff(times) < 0)
    if back.size:
        raise BadInput(trace.file("requests"), int(back[0]) + 2, "arrival_s",
                       "arrivals are not in order: a replay needs them sorted")
