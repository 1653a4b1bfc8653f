"""The front end's output deliveries in a request-level replay.

Why: under a burst, vLLM's API process spends its one event loop both
admitting requests and streaming every running request's new tokens, so a
first token reaches the client later than the engine made it, and
admissions wait behind deliveries (``harness.requestlevel.frontend``: one FIFO server
for both). The engine's steps are what the front end is handed: each step
ends with one new token per request that decoded in it and one per request
whose prompt it finished (its first token). The twin records those steps;
this module turns them into the front end's output jobs and the delivery
times of each request's first and last tokens (the last too, so that the
twin's TPOT and end-to-end latency are timed at the client like its TTFT,
as the measured ones are).

Because admissions wait behind outputs and outputs depend on when requests
reached the engine, ``replay_with_deliveries`` replays until the engine
arrivals stop moving (at most ``MAX_ROUNDS`` replays; the rounds and the
last change are reported). Recompute preemptions re-prefill without a new
output token; they are rare in these traces and counted as decodes are not.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from harness.requestlevel.frontend import FrontEnd
from harness.twin.simulation import TwinResult

MAX_ROUNDS = 4
SETTLED_S = 1e-6  # engine arrivals moving less than this between replays have settled
_MATCH_S = 1e-6  # a first token belongs to the step that ends within this of it


@dataclass
class Deliveries:
    first_token_s: np.ndarray  # delivered first token, per request (the trace's clock; NaN where none)
    last_token_s: np.ndarray  # delivered last token, likewise
    rounds: int  # replays run
    moved_s: float  # largest change of an engine arrival in the last round (0 when settled)


def step_outputs(res: TwinResult, first_t: np.ndarray, shift_s: float,
                 after_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The output jobs of the steps ending after ``after_s`` (the trace's
    clock; the log's is ``shift_s`` later): their end times (sorted, the
    trace's clock), tokens per job (decodes + first tokens), and for each
    request the job of its first token (-1 if it has none)."""
    ends, decodes = _steps(res, shift_s, after_s)
    job = job_of(ends, first_t)
    firsts = np.bincount(job[job >= 0], minlength=ends.size)
    return ends, decodes + firsts, job


def _steps(res: TwinResult, shift_s: float, after_s: float) -> tuple[np.ndarray, np.ndarray]:
    st = res.steps
    if st is None:
        raise ValueError("deliveries need the twin's step log (record_steps)")
    ends = np.asarray(st["end_s"], dtype=np.float64) - shift_s  # a step log's table, or a fit's arrays (twin_timings)
    keep = ends > after_s
    ends, decodes = ends[keep], np.asarray(st["decode_tokens"], dtype=np.int64)[keep]
    order = np.argsort(ends, kind="stable")
    return ends[order], decodes[order]


def job_of(ends: np.ndarray, t: np.ndarray, match_s: float = _MATCH_S) -> np.ndarray:
    """The output job (index into ``ends``) of tokens made at ``t``; -1 for
    NaN (and for every token when there are no steps)."""
    job = np.full(t.size, -1, dtype=np.int64)
    ok = np.isfinite(t)
    if ends.size and ok.any():
        k = np.clip(np.searchsorted(ends, t[ok] - match_s), 0, ends.size - 1)
        if not (np.abs(ends[k] - t[ok]) <= match_s).all():
            raise ValueError("deliveries: a token matches no recorded step")
        job[ok] = k
    return job


def replay_with_deliveries(replay: Callable[[np.ndarray], tuple[TwinResult, np.ndarray, np.ndarray]],
                           client: np.ndarray, fe: FrontEnd,
                           shift_s: float) -> tuple[TwinResult, np.ndarray, Deliveries]:
    """Replay (``replay(entry)`` -> the twin's result, whose log is
    ``shift_s`` later than the trace's clock, and each request's engine
    first- and last-token times on the trace's clock) until admissions and
    deliveries agree. Returns the last result, its engine arrivals and the
    deliveries (the trace's clock)."""
    entry = fe.engine_arrivals(client)
    after = float(client.min(initial=np.inf)) - 1e-9 if client.size else 0.0  # the warm-up's steps are not the trace's
    for rounds in range(1, MAX_ROUNDS + 1):
        res, first_t, last_t = replay(entry)
        ends, n, job = step_outputs(res, first_t, shift_s, after)
        new_entry, done = fe.schedule(client, ends, n)
        first, last = (_delivered(done, j, t, fe.per_output_s) for j, t in ((job, first_t), (job_of(ends, last_t), last_t)))
        moved = float(np.max(np.abs(new_entry - entry))) if entry.size else 0.0
        if moved < SETTLED_S or rounds == MAX_ROUNDS:
            return res, entry, Deliveries(first, last, rounds, 0.0 if moved < SETTLED_S else moved)
        entry = new_entry
    raise AssertionError("unreachable")


def _delivered(done: np.ndarray, job: np.ndarray, made: np.ndarray, per_output_s: float) -> np.ndarray:
    """When the tokens made at ``made`` reach the client: their job's end,
    less the token's own cost (an idle request's is in the fitted overhead)."""
    t = np.where(job >= 0, done[np.maximum(job, 0)] - per_output_s, np.nan)
    return np.maximum(t, made)
