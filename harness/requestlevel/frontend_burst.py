"""The front end's cost per delivered token, measured on a real vLLM server's bursts.

Why: ``harness.requestlevel.frontend``'s serial server delivers every engine step's new
tokens, and its cost per token (``c_out``) must come from a measurement, not
from the held-out runs it is judged on. A burst on a real server (the
README's request-level section: a lone probe, then 200 requests at once,
recorded by ``RecordingScheduler`` and timed by ``latroute loadgen``) gives,
for every request, when the engine made its first token (``first_token_s``,
a step's end) and when the client got it. Between the two the front end
worked through what was queued before: admissions and earlier steps'
outputs. ``fit_output_cost`` replays that queue (the client's sends as
admissions, each step's outputs as a job) for a grid of costs and keeps the
one whose predicted delivery delays are closest (median absolute error) to
the measured ones.

The order of the queue is measured too: ``held_delays`` predicts the
tokens the engine made while a burst's admissions were still queued
(``docs/frontend_burst_held.csv``: each such token's step end and its
receipt by the client, server clock) with the admissions in the queue
(FIFO) or without them (deliveries never waiting for an admission).

Inputs: one burst's rows of ``docs/frontend_burst.csv`` (client send and
TTFT, server stamps; the probe first) and that burst's steps in
``docs/frontend_burst_steps.csv`` (end time and tokens emitted, server
clock). The clocks are aligned on the probe as in ``burst_admission``; the
probe's own delay (client receipt - engine first token, idle) is the
constant network and HTTP part, added to every prediction.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.requestlevel.delivery import job_of
from harness.requestlevel.frontend import FrontEnd

GRID_S = np.round(np.arange(0.0, 0.60001e-3, 0.01e-3), 9)  # 0 to 0.6 ms per token, 0.01 ms apart
_MATCH_S = 2e-6  # the stored times are rounded to the microsecond


@dataclass
class DeliveryFit:
    per_output_s: float
    median_abs_err_s: float
    measured_delay_s: np.ndarray  # per burst request: client receipt - engine first token
    predicted_delay_s: np.ndarray  # the same, from the serial server at per_output_s


def _timeline(rows: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Server-clock sends, first tokens and receipts of the burst (probe
    left out), and the probe's idle delivery delay."""
    g = rows.sort_values("arrival_s_client", kind="stable")
    probe, burst = g.iloc[0], g.iloc[1:]
    offset = float(probe["arrival_s_server"] - probe["arrival_s_client"])
    idle = float(probe["arrival_s_client"] + offset + probe["ttft_s"] - probe["first_token_s"])
    send = burst["arrival_s_client"].to_numpy(dtype=np.float64) + offset
    first = burst["first_token_s"].to_numpy(dtype=np.float64)
    receipt = send + burst["ttft_s"].to_numpy(dtype=np.float64)
    return send, first, receipt, idle


def predicted_delays(rows: pd.DataFrame, steps: pd.DataFrame, fe: FrontEnd) -> tuple[np.ndarray, np.ndarray]:
    """Measured and predicted (``fe``'s serial server) delivery delays of a burst's first tokens."""
    send, first, receipt, idle = _timeline(rows)
    return receipt - first, _predict(send, idle, first, steps, fe)


def held_delays(rows: pd.DataFrame, steps: pd.DataFrame, held: pd.DataFrame,
                fe: FrontEnd) -> tuple[np.ndarray, np.ndarray]:
    """Measured and predicted delivery delays of the tokens in ``held``
    (``made_s``: the step end that made it, ``received_s``: the client's
    receipt, both on the server's clock)."""
    send, _, _, idle = _timeline(rows)
    made = held["made_s"].to_numpy(dtype=np.float64)
    return held["received_s"].to_numpy(dtype=np.float64) - made, _predict(send, idle, made, steps, fe)


def _predict(send: np.ndarray, idle: float, made: np.ndarray, steps: pd.DataFrame, fe: FrontEnd) -> np.ndarray:
    st = steps.sort_values("end_s", kind="stable")
    ends = st["end_s"].to_numpy(dtype=np.float64)
    n = st["outputs"].to_numpy(dtype=np.float64)
    k = job_of(ends, made, _MATCH_S)
    if np.any(k < 0):
        raise ValueError("burst deliveries: a token matches no step in the steps table")
    _, done = fe.schedule(np.sort(send, kind="stable"), ends, n)
    return done[k] - fe.per_output_s + idle - made  # the probe's own token is inside its idle delay


def fit_output_cost(rows: pd.DataFrame, steps: pd.DataFrame, per_request_s: float) -> DeliveryFit:
    """The cost per delivered token (on ``GRID_S``) that best explains one
    burst's first-token delivery delays, admissions costing ``per_request_s``."""
    best: DeliveryFit | None = None
    for c in GRID_S:
        meas, pred = predicted_delays(rows, steps, FrontEnd(per_request_s, "burst", float(c), "grid"))
        err = float(np.median(np.abs(pred - meas)))
        if best is None or err < best.median_abs_err_s - 1e-12:
            best = DeliveryFit(float(c), err, meas, pred)
    assert best is not None
    return best
