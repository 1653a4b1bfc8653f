"""``latroute trace query``: SQL over a trace's tables with DuckDB.

The connection and what it may touch live here, apart from the CLI, so the
rules for what a user's SQL can reach are in one place.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from traces.errors import BadInput
from traces.store import Trace

if TYPE_CHECKING:
    import pandas as pd


def run_query(trace: Trace, sql: str) -> pd.DataFrame:
    """The result of ``sql`` over ``trace``'s tables (one view per table)."""
    import duckdb

    if not sql.strip():
        raise BadInput(trace.path, None, "SQL", "empty query")
    con = trace.connect()
    try:
        return con.sql(sql).df()
    except duckdb.Error as e:
        raise BadInput(trace.path, None, "SQL", str(e).splitlines()[0]) from None
    finally:
        con.close()
