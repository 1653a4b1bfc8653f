"""vLLM's API front end as a transform of a request-level trace's arrivals.

Why: a request-level trace times TTFT from the client's send, but the
engine sees a request only once vLLM's OpenAI server has handled it, and
that server is one Python process (HTTP parsing, request validation,
tokenisation, hand-over to the engine core, output processing). At low
rates its work is a constant, which ``calibrate --from-requests`` fits as
the front-end overhead added to every TTFT. Under a burst it is a queue:
200 requests sent at once reach the engine one after another, and the
twin, handed all 200 at t = 0, gives every one its first token within two
steps while the measured first tokens spread over ~0.45 s.

Model: a single server with a fixed cost ``c`` per request (FIFO; with an
accept share, see ``two_phase_done`` and ``MEASURED_ACCEPT_SHARE``: a burst's
requests are all accepted before the first is handled). Request i
(client arrivals ``a`` sorted) is done at ``D_i = max(a_i, D_{i-1}) + c``.
An idle request's ``c`` is already inside the fitted constant overhead, so
the engine arrival is the client arrival plus only the *queueing* behind
earlier requests: ``e_i = D_i - c = i*c + max_{j<=i}(a_j - j*c)``
(vectorised with a running maximum). ``c = 0`` is the identity.

The same process also delivers the engine's outputs: every engine step
hands it one new token per running request (vLLM's ``output_handler``
detokenises them and each request's stream writes its chunk, all in the
API server's one event loop), so a first token reaches the client only
after the loop has worked through everything queued before it. With
``per_output_s`` (``c_out``) > 0 the server's jobs are, in time order, each
request's admission (cost ``c``) and each step's outputs (cost ``c_out``
per token the step produced; admissions first at equal times);
``schedule`` gives both the engine arrivals and when each step's outputs
are delivered. The engine runs in its own process: its steps are not
slowed, only what reaches the client is. An idle request's own
``c_out`` is inside the fitted constant overhead, as its ``c`` is.

Where ``c`` comes from (it must not be tuned on held-out runs): the 1 and
16 q/s calibration runs do not identify it (their requests almost never
overlap in the front end); ``MEASURED_PER_REQUEST_S`` is measured on a real
vLLM 0.32 OpenAI server (see ``burst_admission`` and the README's
request-level section); ``MEASURED_PER_OUTPUT_S`` likewise, from the same
bursts' delivery delays (``harness.requestlevel.frontend_burst``). The values travel in
the profile (``fitted_on.request_fit.frontend``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

# vLLM 0.32.0's OpenAI server (CPU build, tiny-a, this 2-core machine), five bursts of the
# 200 prompts of the Llama-3.3-70B all-at-once run: the last request's arrival_time stamp came
# 157, 164, 196, 231 and 330 ms after the client's first send (0.79-1.65 ms per request);
# the median, 196 ms / 200 requests. docs/frontend_burst.csv holds the per-request times.
MEASURED_PER_REQUEST_S = 0.98e-3
MEASURED_SOURCE = ("measured: vLLM 0.32.0 OpenAI server, 200-request bursts, median of 5 "
                   "(last arrival_time - first client send) / 200")
# The same five bursts: the cost per delivered token that best explains when each first token
# reached the client after the engine made it (harness.requestlevel.frontend_burst.fit_output_cost: 0.13-0.27 ms
# per burst); the median. docs/frontend_burst_steps.csv holds each step's end and outputs.
MEASURED_PER_OUTPUT_S = 0.15e-3
MEASURED_OUTPUT_SOURCE = ("measured: vLLM 0.32.0 OpenAI server, the same bursts, median of 5 per-burst fits "
                          "of the first-token delivery delay (serial loop, cost per delivered token)")


# The same five bursts: the arrival_time stamps (when the server starts handling a request) are not
# spread over the burst as one FIFO would spread them; the first come only after most of the burst's
# span, then follow closely: the server accepts every waiting connection first (HTTP parsing,
# validation) and handles them after. Per burst, a line through the stamps by rank (10th-90th
# percentile of ranks) starts at 70, 68, 89, 68 and 75% of the last stamp (burst_admission's
# accept_share); the median. A request's share of the cost before its handling is that share.
MEASURED_ACCEPT_SHARE = 0.699
MEASURED_ACCEPT_SOURCE = ("measured: vLLM 0.32.0 OpenAI server, the same bursts, median of 5 (intercept of the "
                          "arrival_time stamps by rank / the last stamp)")


def fifo_done(t: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """Completion times of one FIFO server taking jobs in the given order
    (``t`` non-decreasing): ``D_k = max(t_k, D_{k-1}) + cost_k``, i.e.
    ``C_k + max_{j<=k}(t_j - C_{j-1})`` with ``C`` the running total cost."""
    t = np.asarray(t, dtype=np.float64)
    c = np.cumsum(np.asarray(cost, dtype=np.float64))
    if t.size == 0:
        return t.copy()
    return np.maximum(c + np.maximum.accumulate(t - (c - cost)), t + cost)  # max(): rounding never moves one earlier


def two_phase_done(arrival: np.ndarray, accept_s: float, handle_s: float, out_t: np.ndarray,
                   out_cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One non-preemptive server with two kinds of work: a request's
    *accept* (``accept_s``, taken first, in arrival order, whenever any is
    waiting) and then its *handling* (``handle_s``), which queues with the
    output jobs (``out_t`` when each arrives, ``out_cost`` each) in arrival
    order (a request's arrival; at equal times the request first) once its
    accept is done. Returns when each request's handling and each output job
    are done. With ``accept_s`` = 0 this is ``fifo_done`` over all jobs."""
    from harness.requestlevel.frontend_kernel import two_phase_loop

    a = np.ascontiguousarray(arrival, dtype=np.float64)
    ot = np.asarray(out_t, dtype=np.float64)
    order = np.argsort(ot, kind="stable")
    done_h, done_sorted = np.empty(a.size), np.empty(ot.size)
    two_phase_loop(a, float(accept_s), float(handle_s), np.ascontiguousarray(ot[order]),
                   np.ascontiguousarray(np.asarray(out_cost, dtype=np.float64)[order]), done_h, done_sorted)
    done_o = np.empty(ot.size)
    done_o[order] = done_sorted
    return done_h, done_o


@dataclass(frozen=True)
class FrontEnd:
    """The serial front end: ``per_request_s`` of work per request, FIFO;
    with ``accept_share`` > 0 that share of it is the request's accept,
    which the server does before any waiting handling or delivery (see
    ``two_phase_done``)."""

    per_request_s: float = 0.0
    source: str = "none"
    per_output_s: float = 0.0  # per token delivered to a client (0: deliveries are not modelled)
    output_source: str = "none"
    accept_share: float = 0.0  # share of per_request_s done before any waiting handling (0: one FIFO)
    accept_source: str = "none"

    def __post_init__(self) -> None:
        for name, v in (("per-request", self.per_request_s), ("per-output", self.per_output_s)):
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"front end: {name} cost must be a finite number >= 0, not {v}")
        if not (np.isfinite(self.accept_share) and 0 <= self.accept_share <= 1):
            raise ValueError(f"front end: accept share must lie in [0, 1], not {self.accept_share}")

    @property
    def on(self) -> bool:
        return self.per_request_s > 0 or self.per_output_s > 0

    @property
    def delivers(self) -> bool:
        """Whether deliveries are modelled (the replay then needs the engine's steps)."""
        return self.per_output_s > 0

    def schedule(self, arrival: np.ndarray, out_t: np.ndarray, out_n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One FIFO server for admissions (``arrival`` sorted, cost
        ``per_request_s`` each) and output deliveries (``out_t``: when a
        step's tokens reach the front end, ``out_n``: how many, cost
        ``per_output_s`` each). Returns the engine arrivals (queueing only,
        as ``engine_arrivals``) and when each output job is done."""
        a = np.asarray(arrival, dtype=np.float64)
        if np.any(np.diff(a) < 0):
            raise ValueError("front end: arrivals must be sorted")
        if self.accept_share > 0:
            accept = self.accept_share * self.per_request_s
            done_h, done_o = two_phase_done(a, accept, self.per_request_s - accept, out_t,
                                            self.per_output_s * np.asarray(out_n, dtype=np.float64))
            return np.maximum(done_h - self.per_request_s, a), done_o
        t = np.concatenate([a, np.asarray(out_t, dtype=np.float64)])
        cost = np.concatenate([np.full(a.size, self.per_request_s),
                               self.per_output_s * np.asarray(out_n, dtype=np.float64)])
        kind = np.concatenate([np.zeros(a.size, dtype=np.int8), np.ones(t.size - a.size, dtype=np.int8)])
        order = np.lexsort((kind, t))  # time order; an admission before an output at the same time
        done = np.empty_like(t)
        done[order] = fifo_done(t[order], cost[order])
        return np.maximum(done[:a.size] - self.per_request_s, a), done[a.size:]

    def engine_arrivals(self, arrival: np.ndarray) -> np.ndarray:
        """When each request reaches the engine (``arrival`` sorted, seconds),
        admissions alone (no outputs competing for the server)."""
        a = np.asarray(arrival, dtype=np.float64)
        if self.per_request_s == 0 or a.size == 0:
            return a.copy()
        return self.schedule(a, np.empty(0), np.empty(0))[0]

    def to_json(self) -> dict:
        return {"per_request_s": self.per_request_s, "source": self.source,
                "per_output_s": self.per_output_s, "output_source": self.output_source,
                "accept_share": self.accept_share, "accept_source": self.accept_source}

    @classmethod
    def from_json(cls, d: dict | None) -> FrontEnd:
        if not d:
            return cls()
        return cls(float(d.get("per_request_s", 0.0)), str(d.get("source", "profile")),
                   float(d.get("per_output_s", 0.0)), str(d.get("output_source", "none")),
                   float(d.get("accept_share", 0.0)), str(d.get("accept_source", "none")))


def measured() -> FrontEnd:
    return FrontEnd(MEASURED_PER_REQUEST_S, MEASURED_SOURCE, MEASURED_PER_OUTPUT_S, MEASURED_OUTPUT_SOURCE,
                    MEASURED_ACCEPT_SHARE, MEASURED_ACCEPT_SOURCE)


def burst_admission(client: pd.DataFrame, server: pd.DataFrame) -> dict:
    """The front end's admission time of one burst, from a ``latroute loadgen``
    run (``client``: client_id, arrival_s = send, ttft_s) and the
    ``RecordingScheduler``'s requests of the same run (``server``: client_id,
    arrival_s = vLLM's ``arrival_time`` stamp, taken when the server starts
    rendering a request, after HTTP parsing and validation).

    The two clocks differ; the run's first request is a lone probe sent
    seconds before the burst, and its send is taken to coincide with its
    arrival stamp (the error is the idle parse time, a few ms). Returns the
    burst size, the last stamp after the first send, the cost per request
    and the accept share: where a line through the stamps by rank (the
    10th to 90th percentile of ranks, clear of the first requests, handled
    before the rest arrived) starts, as a share of the last stamp."""
    j = client.merge(server, on="client_id", suffixes=("_c", "_s"))
    if len(j) < 3:
        raise ValueError("burst admission: needs a probe and a burst joined on client_id")
    j = j.sort_values("arrival_s_c", kind="stable")
    probe, burst = j.iloc[0], j.iloc[1:]
    offset = float(probe["arrival_s_s"] - probe["arrival_s_c"])
    send = burst["arrival_s_c"].to_numpy(dtype=np.float64) + offset
    stamp = burst["arrival_s_s"].to_numpy(dtype=np.float64)
    span = float(stamp.max() - send.min())
    rel = np.sort(stamp - send.min())
    rank = np.arange(rel.size)
    mid = (rank >= 0.1 * rel.size) & (rank < 0.9 * rel.size)
    intercept = float(np.polyfit(rank[mid], rel[mid], 1)[1])
    return {"requests": int(len(burst)), "send_spread_s": float(np.ptp(send)), "admission_s": span,
            "per_request_s": span / len(burst), "accept_share": min(max(intercept / span, 0.0), 1.0)}
