"""Whether a run's log holds every request the run sent.

Benchmark clients log a request when it completes, so a request that
failed or timed out is often not logged at all, and those are the slowest:
a run taken as logged looks faster than it was. Where the source states
how many requests were sent (``vllm bench serve``'s ``num_prompts``, the
``num_requests`` of a vllm-reqstats run) or implies it (LMBench's
ShareGPT client launches prompt *i* at ``start + i / qps``, every prompt of
its file), the import compares, says how many are missing and where, and
refuses the run unless ``--allow-incomplete``.

LMBench's launch schedule: ``sharegpt-qa.py`` of LMCache/LMBenchmark
(``SHAREGPT_CLIENT``) waits for each prompt's slot and hands it to an
event loop that stamps ``launch_time`` when the request starts, and logs a
request only from its completion callback (a request that raised is
dropped). So the launch times sit on a grid of 1/qps, each a little late.
When every logged launch is within ``SLOT_TOLERANCE`` of a slot, the slots
are told apart (a launch would have to lag by most of a slot to be
misplaced) and the skipped ones are the missing requests; when the client
fell behind its grid (at high rates its launches stray half a slot and
share slots), slots cannot be told apart and only the count says
anything. Slots count from the first logged launch (a missing first
request cannot be seen).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.errors import BadInput

SLOT_TOLERANCE = 0.25  # of a slot: every logged launch this close to the 1/qps grid
SHAREGPT_PROMPTS = 252
SHAREGPT_CLIENT = ("LMBench's ShareGPT client sends all 252 prompts of its sharegpt/run.json, one per slot "
                   "(https://github.com/LMCache/LMBenchmark/blob/d059bc26d53a960641a7e0037a2a2b6b09f9595c/"
                   "sharegpt/sharegpt-qa.py#L145-L151)")
COMPLETE, INCOMPLETE, UNKNOWN = "complete", "incomplete", "unknown"


@dataclass
class Completeness:
    """A run's log against what the run sent."""

    status: str  # COMPLETE, INCOMPLETE or UNKNOWN
    logged: int
    sent: int | None = None
    missing: int | None = None
    where: str = ""  # which requests are missing, when that is known
    how: str = ""  # how the number sent is known, or why it is not
    allowed: bool = False  # imported anyway (--allow-incomplete)

    def line(self) -> str:
        if self.status == COMPLETE:
            return f"complete: {self.logged} of {self.sent} sent logged ({self.how})"
        if self.status == UNKNOWN:
            return f"completeness unknown: {self.logged} logged; {self.how}"
        missing = f"{self.missing} of {self.sent}" if self.sent is not None else f"at least {self.missing}"
        return (f"incomplete: {missing} requests not logged{' (' + self.where + ')' if self.where else ''}; "
                f"{self.how}" + ("; imported with --allow-incomplete" if self.allowed else ""))

    def to_meta(self) -> dict:
        return {"status": self.status, "logged": self.logged, "sent": self.sent, "missing": self.missing,
                "where": self.where, "how": self.how, "allowed": self.allowed}


def enforce(c: Completeness, allow: bool, path, column: str) -> list[str]:
    """Refuse an incomplete run (BadInput naming the file and field) unless ``allow``; the note to print."""
    if c.status == INCOMPLETE:
        if not allow:
            raise BadInput(path, None, column, c.line() + "; the missing requests are not a random sample "
                                                         "(a request that failed or timed out is not logged): "
                                                         "give --allow-incomplete to import the logged ones")
        c.allowed = True
    return [c.line()]


def ranges(idx: np.ndarray, limit: int = 6) -> str:
    """``[3, 4, 5, 9]`` as ``3-5, 9``; beyond ``limit`` ranges, the first ones, how many more, and the last."""
    idx = np.asarray(idx, dtype=np.int64)
    if not idx.size:
        return ""
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    parts = [f"{int(r[0])}" if r.size == 1 else f"{int(r[0])}-{int(r[-1])}" for r in np.split(idx, breaks)]
    if len(parts) <= limit:
        return ", ".join(parts)
    return ", ".join(parts[:limit - 1]) + f", ... ({len(parts) - limit} more), " + parts[-1]


def counted(sent: int, logged: int, how: str, where: str = "") -> Completeness:
    """A source that states how many it sent."""
    if logged >= sent:
        return Completeness(COMPLETE, logged, sent, 0, "", how)
    return Completeness(INCOMPLETE, logged, sent, sent - logged, where, how)


def launch_slots(launch_s: np.ndarray, qps: float) -> tuple[np.ndarray | None, str]:
    """Each logged launch's slot on the 1/qps grid from the first launch, or None (and why) when the launches
    stray more than ``SLOT_TOLERANCE`` from the grid or share slots; else how close they sit."""
    x = (np.sort(np.asarray(launch_s, dtype=np.float64)) - float(np.min(launch_s))) * qps
    slots = np.rint(x)
    stray = float(np.abs(x - slots).max()) if x.size else 0.0
    shared = int(np.sum(np.diff(slots) < 1)) if slots.size > 1 else 0
    if shared:
        return None, (f"the launches do not keep one request per 1/{qps:g} s slot ({shared} share a slot), so "
                      "slots cannot be told apart")
    if stray > SLOT_TOLERANCE:
        return None, (f"the launches stray up to {stray:.2f} of a slot from the 1/{qps:g} s grid (the client "
                      "fell behind its schedule), so slots cannot be told apart")
    return slots.astype(np.int64), f"every logged launch within {stray:.2f} of its slot"


def lmbench(launch_s: np.ndarray, qps: float | None, workload: str | None) -> Completeness:
    """An LMBench run: the sent count from its ShareGPT client, the gaps from its launch slots."""
    n = int(len(launch_s))
    sent = SHAREGPT_PROMPTS if (workload or "").strip().lower() == "sharegpt" else None
    if sent is not None and n > sent:
        sent = None  # not the published client's file: the count says nothing
    if sent is not None and n == sent:
        return counted(sent, n, SHAREGPT_CLIENT)
    if qps is None or not qps > 0:
        if sent is None:
            return Completeness(UNKNOWN, n, how="the run's target rate and size are not stated (runs.csv)")
        return counted(sent, n, SHAREGPT_CLIENT + "; no target rate in runs.csv, so no launch slots")
    slots, why = launch_slots(launch_s, qps)
    grid = f"launch slots of 1/{qps:g} s"
    if slots is None:
        if sent is None:
            return Completeness(UNKNOWN, n, how=f"no run size is stated, and {why}")
        return counted(sent, n, f"{SHAREGPT_CLIENT}; {why}")
    last = int(slots[-1])
    gaps = np.setdiff1d(np.arange(last + 1), slots)
    if sent is not None and last >= sent:
        sent = None  # launches past the published file's size: another file, the count says nothing
    if sent is None:
        if not gaps.size:
            return Completeness(UNKNOWN, n, how=f"no gap in the {grid} 0-{last}, but the run's size is not "
                                                "stated, so requests after the last launch cannot be seen")
        return Completeness(INCOMPLETE, n, None, int(gaps.size), f"{grid}: {ranges(gaps)} of 0-{last}",
                            "the run's size is not stated: requests after the last launch cannot be seen")
    tail = np.arange(last + 1, sent)
    where = f"{grid}: {ranges(np.concatenate([gaps, tail]))} of 0-{sent - 1}" if gaps.size or tail.size else ""
    return counted(sent, n, f"{SHAREGPT_CLIENT}; {why}", where)
