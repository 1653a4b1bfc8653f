"""``latroute trace query``: SQL over a trace's tables with DuckDB.

The connection and what it may touch live here, apart from the CLI, so the
rules for what a user's SQL can reach are in one place.

Read-only by default, and enforced by DuckDB itself rather than by reading
the SQL (issue 11): a query could otherwise read any file
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
"""
from __future__ import annotations

from typing import TYPE_CHECKING

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
        for key, value in SANDBOX_SETTINGS:
            con.execute(f"SET {key} = {value}")
    except BaseException:
        con.close()
        raise
    return con


def _refusal(e: Exception) -> str:
    import duckdb

    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    locked = "configuration has been locked" in first or "disabled through configuration" in first
    if isinstance(e, duckdb.PermissionException) or locked:
        return f"{first}; {UNSAFE_HINT}"
    return first


def run_query(trace: Trace, sql: str, unsafe: bool = False) -> pd.DataFrame:
    """The result of ``sql`` over ``trace``'s tables, read-only unless ``unsafe``."""
    import duckdb

    if not sql.strip():
        raise BadInput(trace.path, None, "SQL", "empty query")
    con = trace.connect() if unsafe else sandboxed_connection(trace)
    try:
        return con.sql(sql).df()
    except duckdb.Error as e:
        raise BadInput(trace.path, None, "SQL", _refusal(e)) from None
    finally:
        con.close()
