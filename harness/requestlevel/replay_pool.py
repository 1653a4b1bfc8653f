"""The replays of a request-level fit, spread over worker processes.

Why: a fit's time is its twin replays (hundreds of evaluations, each a replay of every trace under
every assignment of its fleet), and one evaluation's replays are independent of each other: the
traces share nothing, and neither do a fleet's replicas once its assignment is fixed
(``harness.requestlevel.replay.replica_parts``). So an evaluation's parts run side by side on the
machine's cores, and the results are put back in the order the parts were given: the same numbers
whatever the number of workers (noise is off in a fit; a part's replay depends on its own
inputs only).

The workers are forked from the fitting process after its first evaluation, so they inherit the
twin's compiled kernels instead of compiling them again. One worker (``jobs`` 1) replays in the
fitting process itself.
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


class ReplayPool:
    """``map`` over worker processes (``jobs`` > 1, started at the second call) or in this process."""

    def __init__(self, jobs: int = 1):
        self.jobs = max(int(jobs), 1)
        self._pool: ProcessPoolExecutor | None = None
        self._calls = 0

    def map(self, fn: Callable, items: Iterable) -> list:
        items = list(items)
        self._calls += 1
        if self.jobs == 1 or len(items) < 2 or self._calls == 1:  # the first call compiles the kernels here
            return [fn(x) for x in items]
        if self._pool is None:
            self._pool = ProcessPoolExecutor(max_workers=self.jobs, mp_context=multiprocessing.get_context("fork"))
        return list(self._pool.map(fn, items))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> ReplayPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
