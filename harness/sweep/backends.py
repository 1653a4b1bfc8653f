"""Where a sweep's cells run: a local process pool or Ray.

Both yield ``(cell, row, timing)`` as cells finish, in completion order;
the sweep writes each at once (``sweep_store``) and sorts the rows by cell
at the end, so results do not depend on the backend or the worker count.

- ``local``: a process pool on this machine. Workers are tied to their
  parent (Linux ``PR_SET_PDEATHSIG`` with SIGKILL, which a worker busy in
  Numba cannot ignore or delay): a killed sweep takes its workers with it
  instead of leaving them blocked with the caller's pipes. SIGTERM to the
  driver is turned into an interrupt while the pool runs, so the pool is
  terminated (and the finished cells kept) as on Ctrl-C.
- ``ray``: each cell is a Ray task, on an existing cluster (``address``) or
  on a local Ray started for the run and stopped after it. The sweep
  specification goes to the object store once; tasks get a reference.
  Ray is an optional extra (``pip install latroute[ray]``), imported only
  here and only when asked for. Ray's own processes share the driver's fate
  only loosely (its agents outlive a SIGKILLed driver for minutes), so a
  local Ray gets a reaper: a small process that holds a pipe from the
  driver and, when the pipe closes (the driver ended, however it ended),
  kills the processes that Ray's start-up created.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path

BACKENDS = ("local", "ray")
PR_SET_PDEATHSIG = 1


def default_workers() -> int:
    """Worker processes of a sweep when none are asked for: the machine's
    cores, at most 2. Here, free of numpy, so ``latroute sweep --help`` can
    show it."""
    return max(1, min(os.cpu_count() or 1, 2))


def _die_with_parent(parent: int) -> None:
    """Pool initializer: SIGKILL this worker when its parent dies (and die
    now if the parent is already gone: the death signal is armed only from
    here on)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the pool's own shutdown still applies
        pass
    if os.getppid() != parent:
        os._exit(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Terminated(KeyboardInterrupt):
    """SIGTERM to a sweep's driver: handled like Ctrl-C (stop the pool,
    keep the finished cells)."""


def _interrupt_on_sigterm(signum, frame) -> None:
    raise Terminated()


def run_local(task: Callable, spec, cells: list, workers: int) -> Iterator[tuple]:
    if workers <= 1:
        for c in cells:
            yield c, *task(spec, c)
        return
    import threading

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    pool = ProcessPoolExecutor(max_workers=workers, initializer=_die_with_parent, initargs=(os.getpid(),))
    finished = False
    try:
        pending = {pool.submit(task, spec, c): c for c in cells}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                cell = pending.pop(fut)
                yield cell, *fut.result()
        finished = True
    finally:
        if finished:
            pool.shutdown(wait=True)
        else:  # interrupted or failed: stop the cells in flight now, not after they finish
            procs = list((getattr(pool, "_processes", None) or {}).values())
            pool.shutdown(wait=False, cancel_futures=True)
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join(timeout=5)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _descendants(root: int) -> dict[int, int]:
    """pid -> start time of every process below ``root`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(p.name))
    out, todo = {}, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            st = _start_time(c)
            if st is not None:
                out[c] = st
                todo.append(c)
    return out


REAPER = """
import json, os, signal, sys
procs = json.loads(sys.argv[1])
sys.stdin.read()  # returns when the driver's end of the pipe closes
for pid, start in procs.items():
    try:
        with open(f"/proc/{pid}/stat") as f:
            if int(f.read().rsplit(")", 1)[1].split()[19]) != start:
                continue  # the pid was reused
        os.kill(int(pid), signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass
"""


def _reaper_for(procs: dict[int, int]) -> subprocess.Popen | None:
    if not procs or not Path("/proc").is_dir():
        return None
    return subprocess.Popen([sys.executable, "-c", REAPER, json.dumps(procs)], stdin=subprocess.PIPE,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def run_ray(task: Callable, spec, cells: list, workers: int, address: str | None = None) -> Iterator[tuple]:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--backend ray needs Ray: pip install 'latroute[ray]'") from None
    started = not ray.is_initialized()
    reaper = None
    if started:
        kwargs = {"address": address} if address else {"num_cpus": workers, "include_dashboard": False}
        os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
        ray.init(log_to_driver=False, configure_logging=False, **kwargs)
        if not address:
            reaper = _reaper_for(_descendants(os.getpid()))
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
        if reaper is not None:
            reaper.stdin.close()  # the reaper kills whatever of this Ray is still running
            reaper.wait()


@contextmanager
def latched_interrupts() -> Iterator[Callable[[], None]]:
    """Ctrl-C that cannot be lost: while the cells run, SIGINT is recorded
    as well as raised, and the ``check`` this yields raises it again after a
    cell if anything under the cell (a C extension's signal handling, a
    cleanup swallowing exceptions) consumed the KeyboardInterrupt. A sweep
    that was once seen running to its end and exiting 0 after a Ctrl-C is
    why; so is an error a library raised after swallowing one (llvmlite
    drops a KeyboardInterrupt raised in its ctypes callback and Numba then
    fails with ``no compiled object yet``), which becomes the interruption
    it was. An ignored SIGINT (a background job's) stays ignored."""
    import threading

    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield lambda: None
        return
    seen: list[int] = []

    def record_and_raise(signum, frame):
        seen.append(signum)
        previous(signum, frame)
        raise KeyboardInterrupt  # a handler that returned: Ctrl-C still ends the cells

    def check() -> None:
        if seen:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, record_and_raise)
    try:
        yield check
    except Exception:
        if seen:
            raise KeyboardInterrupt from None
        raise
    finally:
        signal.signal(signal.SIGINT, previous)


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


def check_ray() -> None:
    """Refuse ``--backend ray`` where Ray cannot be imported, before the
    sweep directory exists (not after it was created and left behind)."""
    from traces.errors import BadOption

    try:
        import ray  # noqa: F401
    except ImportError:
        raise BadOption("--backend", "ray needs Ray, which is not installed here: pip install 'latroute[ray]' "
                        "(or --backend local)") from None
