"""Where a sweep's cells run: a local process pool or Ray.

Both yield ``(cell, row, timing)`` as cells finish, in completion order;
the sweep writes each at once (``sweep_store``) and sorts the rows by cell
at the end, so results do not depend on the backend or the worker count.

- ``local``: a process pool on this machine. Workers are tied to their
  parent (Linux ``PR_SET_PDEATHSIG``): a killed sweep takes its workers with
  it instead of leaving them blocked with the caller's pipes.
- ``ray``: each cell is a Ray task, on an existing cluster (``address``) or
  on a local Ray started for the run and stopped after it. The sweep
  specification goes to the object store once; tasks get a reference.
  Ray is an optional extra (``pip install latroute[ray]``), imported only
  here and only when asked for.
"""
from __future__ import annotations

import ctypes
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

BACKENDS = ("local", "ray")
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Pool initializer: SIGTERM this worker when its parent dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the pool's own shutdown still applies
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle


def run_local(task: Callable, spec, cells: list, workers: int) -> Iterator[tuple]:
    if workers <= 1:
        for c in cells:
            yield c, *task(spec, c)
        return
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_die_with_parent)
    try:
        pending = {pool.submit(task, spec, c): c for c in cells}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                cell = pending.pop(fut)
                yield cell, *fut.result()
    finally:
        procs = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for p in procs:  # cells in flight when interrupted: stop them now, not after they finish
            if p.is_alive():
                p.terminate()


def run_ray(task: Callable, spec, cells: list, workers: int, address: str | None = None) -> Iterator[tuple]:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--backend ray needs Ray: pip install 'latroute[ray]'") from None
    started = not ray.is_initialized()
    if started:
        kwargs = {"address": address} if address else {"num_cpus": workers, "include_dashboard": False}
        ray.init(log_to_driver=False, configure_logging=False, **kwargs)
    try:
        remote = ray.remote(num_cpus=1, max_retries=0)(task)
        spec_ref = ray.put(spec)
        refs = {remote.remote(spec_ref, c): c for c in cells}
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                cell = refs.pop(ref)
                yield cell, *ray.get(ref)
    finally:
        for ref in list(refs) if "refs" in locals() else []:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def run_cells(task: Callable, spec, cells: list, workers: int, backend: str = "local",
              address: str | None = None) -> Iterator[tuple]:
    if backend == "local":
        return run_local(task, spec, cells, workers)
    if backend == "ray":
        return run_ray(task, spec, cells, workers, address)
    raise ValueError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")


class Progress:
    """Cells done / total, rate and ETA on stderr, at most once a second."""

    def __init__(self, total: int, backend: str, echo: Callable[[str], None], already: int = 0):
        self.total, self.backend, self.echo = total, backend, echo
        self.done = already
        self.start = time.monotonic()
        self.last = 0.0
        self.fresh = 0

    def step(self) -> None:
        self.done += 1
        self.fresh += 1
        now = time.monotonic()
        if now - self.last >= 1.0 or self.done == self.total:
            self.last = now
            rate = self.fresh / max(now - self.start, 1e-9)
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            self.echo(f"[{self.backend}] {self.done}/{self.total} cells, {rate:.2f} cells/s, ETA {eta:,.0f} s")
