"""The front end's output deliveries in a request-level replay.

Why: under a burst, vLLM's API process spends its one event loop both
admitting requests and streaming every running request's new tokens, so a
first token reaches the client later than the engine made it, and
admissions wait behind deliveries (``harness.frontend``: one FIFO server
for both). The engine's steps are what the front end is handed: each step
ends with one new token per request that decoded in it and one per request
whose prompt it finished (its first token). The twin records those steps;
this module turns them into the front end's output jobs and the first
tokens' delivery times.

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

from harness.frontend import FrontEnd
from harness.twin import TwinResult

MAX_ROUNDS = 4
SETTLED_S = 1e-6  # engine arrivals moving less than this between replays have settled
_MATCH_S = 1e-6  # a first token belongs to the step that ends within this of it


@dataclass
class Deliveries:
    first_token_s: np.ndarray  # delivered first token, per request (the trace's clock; NaN where none)
    rounds: int  # replays run
    moved_s: float  # largest change of an engine arrival in the last round (0 when settled)


def step_outputs(res: TwinResult, first_t: np.ndarray, shift_s: float,
                 after_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The output jobs of the steps ending after ``after_s`` (the trace's
    clock; the log's is ``shift_s`` later): their end times (sorted, the
    trace's clock), tokens per job (decodes + first tokens), and for each
    request the job of its first token (-1 if it has none)."""
    st = res.steps
    if st is None:
        raise ValueError("deliveries need the twin's step log (record_steps)")
    ends = st["end_s"].to_numpy(dtype=np.float64) - shift_s
    st, ends = st[ends > after_s], ends[ends > after_s]
    decodes = st["decode_tokens"].to_numpy(dtype=np.int64)
    order = np.argsort(ends, kind="stable")
    ends, decodes = ends[order], decodes[order]
    job = np.full(first_t.size, -1, dtype=np.int64)
    ok = np.isfinite(first_t)
    if ends.size and ok.any():
        k = np.clip(np.searchsorted(ends, first_t[ok] - _MATCH_S), 0, ends.size - 1)
        hit = np.abs(ends[k] - first_t[ok]) <= _MATCH_S
        if not hit.all():
            raise ValueError("deliveries: a first token matches no recorded step")
        job[ok] = k
    firsts = np.bincount(job[job >= 0], minlength=ends.size)
    return ends, decodes + firsts, job


def replay_with_deliveries(replay: Callable[[np.ndarray], tuple[TwinResult, np.ndarray]], client: np.ndarray,
                           fe: FrontEnd, shift_s: float) -> tuple[TwinResult, np.ndarray, Deliveries]:
    """Replay (``replay(entry)`` -> the twin's result, whose log is
    ``shift_s`` later than the trace's clock, and each request's engine
    first-token time on the trace's clock) until admissions and deliveries
    agree. Returns the last result, its engine arrivals and the deliveries
    (the trace's clock)."""
    entry = fe.engine_arrivals(client)
    after = float(client.min(initial=np.inf)) - 1e-9 if client.size else 0.0  # the warm-up's steps are not the trace's
    for rounds in range(1, MAX_ROUNDS + 1):
        res, first_t = replay(entry)
        ends, n, job = step_outputs(res, first_t, shift_s, after)
        new_entry, done = fe.schedule(client, ends, n)
        delivered = np.where(job >= 0, done[np.maximum(job, 0)] - fe.per_output_s, np.nan)
        delivered = np.maximum(delivered, first_t)  # the idle request's own cost is in the fitted overhead
        moved = float(np.max(np.abs(new_entry - entry))) if entry.size else 0.0
        if moved < SETTLED_S or rounds == MAX_ROUNDS:
            return res, entry, Deliveries(delivered, rounds, 0.0 if moved < SETTLED_S else moved)
        entry = new_entry
    raise AssertionError("unreachable")
