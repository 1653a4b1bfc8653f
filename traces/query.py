"""``latroute trace query``: SQL over a trace's tables with DuckDB.

The connection and what it may touch live here, apart from the CLI, so the
rules for what a user's SQL can reach are in one place.

Read-only by default, and enforced by DuckDB itself rather than by reading
the SQL: a query could otherwise read any file
(``read_csv('/etc/passwd')``), write anywhere (``COPY ... TO``), install
extensions, or overwrite the trace it is querying. The sandbox:

- each table is registered as a pyarrow dataset over its Parquet file. The
  dataset streams from disk through Arrow (no copy of a 10M-row table in
  memory, projection and filters pushed down), and DuckDB itself needs no
  file access to scan it;
- then ``enable_external_access = false``: DuckDB opens no file, directory,
  URL or database (``read_*``, ``FROM 'file'``, ``COPY``, ``EXPORT``,
  ``ATTACH``, ``INSTALL``, ``LOAD``). No ``allowed_paths`` or
  ``allowed_directories`` are granted: DuckDB lets a query *write* to an
  allowed path (``COPY ... TO '<trace>/requests.parquet'
  (USE_TMP_FILE false)`` replaced the table in a test), so none is safe;
- extension autoloading and autoinstalling off, replacement scans of Python
  variables off;
- ``lock_configuration = true`` last, so no ``SET``/``RESET``/``PRAGMA``
  undoes any of it.

``unsafe=True`` (``--unsafe``) gives the old connection: one view per table
over ``read_parquet`` and DuckDB's full access.

Times in a trace are seconds from its first arrival; ``wall_clock(s)`` turns
them into UTC timestamps where the source had a wall clock (meta.json's
``wall_clock_start``: Azure traces) and fails with a clear message where it
had none, rather than printing dates in 1970.

Interruptible and bounded: DuckDB runs a query in C++ without
returning to Python, so Python's own SIGINT handler would run only after the
query ends (a ``count(*)`` over ``range(10^12)`` ignored Ctrl-C for hours).
While a query runs, SIGINT and SIGTERM are only noted (their C-level
handler writes to a wakeup fd) and a watchdog thread, woken by that fd or by
the ``timeout``, calls ``connection.interrupt()``; the query then raises
KeyboardInterrupt (``Terminated`` for SIGTERM) or ``QueryTimeout``.
"""
from __future__ import annotations

import math
import os
import re
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from traces.errors import BadInput
from traces.store import Trace

if TYPE_CHECKING:
    import duckdb
    import pandas as pd

# applied in this order: the lock must come last
SANDBOX_SETTINGS = (
    ("autoinstall_known_extensions", "false"),
    ("autoload_known_extensions", "false"),
    ("python_enable_replacements", "false"),
    ("enable_external_access", "false"),
    ("lock_configuration", "true"),
)
DEFAULT_TIMEOUT_S = 300.0  # --timeout's default; 0 means none


class QueryTimeout(Exception):
    """The query ran past its time limit and was interrupted (exit 1, not bad input)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM during a query: handled as Ctrl-C is (the CLI exits 143)."""

    signum = signal.SIGTERM


UNSAFE_HINT = "trace query reads the trace's tables and nothing else (--unsafe lifts this)"


def sandboxed_connection(trace: Trace) -> duckdb.DuckDBPyConnection:
    """An in-memory connection that sees the trace's tables (one relation
    per table present) and can open no file, extension or database."""
    import duckdb
    import pyarrow.dataset as ds

    datasets = {}
    for name in trace.tables:
        trace.parquet(name)  # refuse corrupt files with a clear message
        datasets[name] = ds.dataset(str(trace.file(name)), format="parquet")
    con = duckdb.connect(":memory:")
    try:
        for name, dataset in datasets.items():
            con.register(name, dataset)
        add_wall_clock(con, trace)
        for key, value in SANDBOX_SETTINGS:
            con.execute(f"SET {key} = {value}")
    except BaseException:
        con.close()
        raise
    return con


def wall_clock_start(trace: Trace) -> str | None:
    """The UTC time of the trace's time 0 (ISO 8601), if its source had one.
    Azure traces imported before ``wall_clock_start`` existed keep it as
    ``source.t0``."""
    start = trace.meta.get("wall_clock_start")
    src = trace.meta.get("source") if isinstance(trace.meta.get("source"), dict) else {}
    if start is None and src.get("kind") == "azure":
        start = src.get("t0")
    return start if isinstance(start, str) else None


def add_wall_clock(con: duckdb.DuckDBPyConnection, trace: Trace) -> None:
    """``wall_clock(seconds)``: the trace's seconds as UTC timestamps."""
    import pandas as pd

    start = wall_clock_start(trace)
    if start is None:
        msg = f"{trace.path.name} has no wall clock (meta.json: no wall_clock_start): its times count from 0"
        con.execute(f"CREATE MACRO wall_clock(s) AS error('{msg.replace(chr(39), chr(39) * 2)}')")
        return
    t0 = pd.Timestamp(start).tz_convert("UTC").tz_localize(None) if pd.Timestamp(start).tzinfo else pd.Timestamp(start)
    con.execute(f"CREATE MACRO wall_clock(s) AS TIMESTAMP '{t0.isoformat(sep=' ')}' "
                "+ to_microseconds(CAST(round(s * 1e6) AS BIGINT))")


def _failed_table(trace: Trace, message: str) -> str | None:
    """The table whose file failed to stream (DuckDB: "reading the stream
    registered as 'NAME' failed"), if that is what the error says."""
    m = re.search(r"stream registered as '([^']+)'", message)
    return m.group(1) if m and m.group(1) in trace.tables else None


def _refusal(e: Exception) -> str:
    import duckdb

    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    locked = "configuration has been locked" in first or "disabled through configuration" in first
    if isinstance(e, duckdb.PermissionException) or locked:
        return f"{first}; {UNSAFE_HINT}"
    return first


@contextmanager
def interruptible(interrupt: Callable[[], Any], timeout_s: float) -> Iterator[dict]:
    """While the body runs, SIGINT/SIGTERM (main thread only) and the end of
    ``timeout_s`` (0 or inf: none) call ``interrupt()`` from a watchdog
    thread. Yields a dict whose ``"why"`` becomes ``"timeout"``,
    ``signal.SIGINT`` or ``signal.SIGTERM`` once it has fired; the caller
    turns that into the right exception. The previous handlers and wakeup
    fd are restored on the way out."""
    state: dict = {"why": None}
    deadline = time.monotonic() + timeout_s if timeout_s and math.isfinite(timeout_s) else math.inf
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    os.set_blocking(rfd, False)
    done = threading.Event()
    main = threading.current_thread() is threading.main_thread()
    previous: dict = {}
    old_fd = -1
    if main:
        def note(signum, frame) -> None:
            state["why"] = state["why"] or signum

        for sig in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(sig) is not signal.SIG_IGN:  # a background job's ignored Ctrl-C stays ignored
                previous[sig] = signal.signal(sig, note)
        old_fd = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)

    def watch() -> None:
        while not done.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                state["why"] = state["why"] or "timeout"
                interrupt()
                return
            ready, _, _ = select.select([rfd], [], [], min(left, 0.5))
            if done.is_set():
                return
            if ready:
                try:
                    data = os.read(rfd, 64)
                except BlockingIOError:
                    data = b""
                sigs = [b for b in data if b in (signal.SIGINT, signal.SIGTERM)]
                if sigs:
                    state["why"] = state["why"] or signal.Signals(sigs[0])
                    interrupt()
                    return

    watchdog = threading.Thread(target=watch, name="latroute-query-watchdog", daemon=True)
    watchdog.start()
    try:
        yield state
    finally:
        done.set()
        try:
            os.write(wfd, b"\0")  # wake the watchdog now (0 is no signal's number)
        except OSError:
            pass
        watchdog.join(timeout=5)
        if main:
            signal.set_wakeup_fd(old_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        os.close(rfd)
        os.close(wfd)


def _raise_stopped(why: object, timeout_s: float) -> None:
    if why == "timeout":
        raise QueryTimeout(f"trace query: stopped after --timeout {timeout_s:g} s (pass a larger --timeout, "
                           "or 0 for none)")
    if why == signal.SIGTERM:
        raise Terminated()
    if why is not None:
        raise KeyboardInterrupt()


def run_query(trace: Trace, sql: str, unsafe: bool = False, timeout_s: float = DEFAULT_TIMEOUT_S) -> pd.DataFrame:
    """The result of ``sql`` over ``trace``'s tables, read-only unless
    ``unsafe``; interrupted by Ctrl-C (KeyboardInterrupt), SIGTERM
    (``Terminated``) or after ``timeout_s`` seconds (``QueryTimeout``; 0:
    no limit)."""
    import duckdb

    if not sql.strip():
        raise BadInput(trace.path, None, "SQL", "empty query")
    if unsafe:
        con = trace.connect()
        add_wall_clock(con, trace)
    else:
        con = sandboxed_connection(trace)
    try:
        with interruptible(con.interrupt, timeout_s) as state:
            try:
                df = con.sql(sql).df()
            except duckdb.Error as e:
                _raise_stopped(state["why"], timeout_s)
                bad = _failed_table(trace, str(e))
                if bad is not None:  # the file broke, not the SQL: name the file
                    raise BadInput(trace.file(bad), None, bad, f"unreadable while the query ran "
                                   f"({_refusal(e)})") from None
                raise BadInput(trace.path, None, "SQL", _refusal(e)) from None
            _raise_stopped(state["why"], timeout_s)  # a signal noted as the query ended is still honoured
            return df
    finally:
        con.close()
