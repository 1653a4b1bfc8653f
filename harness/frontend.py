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

Model: a single FIFO server with a fixed cost ``c`` per request. Request i
(client arrivals ``a`` sorted) is done at ``D_i = max(a_i, D_{i-1}) + c``.
An idle request's ``c`` is already inside the fitted constant overhead, so
the engine arrival is the client arrival plus only the *queueing* behind
earlier requests: ``e_i = D_i - c = i*c + max_{j<=i}(a_j - j*c)``
(vectorised with a running maximum). ``c = 0`` is the identity.

Where ``c`` comes from (it must not be tuned on held-out runs): the 1 and
16 q/s calibration runs do not identify it (their requests almost never
overlap in the front end); ``MEASURED_PER_REQUEST_S`` is measured on a real
vLLM 0.32 OpenAI server (see ``burst_admission`` and the README's
request-level section). The value travels in the profile
(``fitted_on.request_fit.frontend``).
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


@dataclass(frozen=True)
class FrontEnd:
    """The serial front end: ``per_request_s`` of work per request, FIFO."""

    per_request_s: float = 0.0
    source: str = "none"

    def __post_init__(self) -> None:
        if not (np.isfinite(self.per_request_s) and self.per_request_s >= 0):
            raise ValueError(f"front end: per-request cost must be a finite number >= 0, not {self.per_request_s}")

    @property
    def on(self) -> bool:
        return self.per_request_s > 0

    def engine_arrivals(self, arrival: np.ndarray) -> np.ndarray:
        """When each request reaches the engine (``arrival`` sorted, seconds)."""
        a = np.asarray(arrival, dtype=np.float64)
        if not self.on or a.size == 0:
            return a.copy()
        if np.any(np.diff(a) < 0):
            raise ValueError("front end: arrivals must be sorted")
        k = np.arange(a.size, dtype=np.float64) * self.per_request_s
        return np.maximum(k + np.maximum.accumulate(a - k), a)  # max(): rounding never moves one earlier

    def to_json(self) -> dict:
        return {"per_request_s": self.per_request_s, "source": self.source}

    @classmethod
    def from_json(cls, d: dict | None) -> FrontEnd:
        if not d:
            return cls()
        return cls(float(d.get("per_request_s", 0.0)), str(d.get("source", "profile")))


def measured() -> FrontEnd:
    return FrontEnd(MEASURED_PER_REQUEST_S, MEASURED_SOURCE)


def burst_admission(client: pd.DataFrame, server: pd.DataFrame) -> dict:
    """The front end's admission time of one burst, from a ``latroute loadgen``
    run (``client``: client_id, arrival_s = send, ttft_s) and the
    ``RecordingScheduler``'s requests of the same run (``server``: client_id,
    arrival_s = vLLM's ``arrival_time`` stamp, taken when the server starts
    rendering a request, after HTTP parsing and validation).

    The two clocks differ; the run's first request is a lone probe sent
    seconds before the burst, and its send is taken to coincide with its
    arrival stamp (the error is the idle parse time, a few ms). Returns the
    burst size, the last stamp after the first send, and the cost per
    request."""
    j = client.merge(server, on="client_id", suffixes=("_c", "_s"))
    if len(j) < 3:
        raise ValueError("burst admission: needs a probe and a burst joined on client_id")
    j = j.sort_values("arrival_s_c", kind="stable")
    probe, burst = j.iloc[0], j.iloc[1:]
    offset = float(probe["arrival_s_s"] - probe["arrival_s_c"])
    send = burst["arrival_s_c"].to_numpy(dtype=np.float64) + offset
    stamp = burst["arrival_s_s"].to_numpy(dtype=np.float64)
    span = float(stamp.max() - send.min())
    return {"requests": int(len(burst)), "send_spread_s": float(np.ptp(send)), "admission_s": span,
            "per_request_s": span / len(burst)}
