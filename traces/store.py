"""Reading and writing trace directories.

Layout: ``DIR/meta.json`` plus one ``DIR/<table>.parquet`` per table present.
Writes are atomic at the directory level: everything goes to a hidden
sibling directory that is renamed into place only when complete, so a crash
or a refused input never leaves a half-written trace behind.
"""
from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from traces.checks.frame_checks import to_arrow, validate_frame
from traces.checks.meta_checks import check_meta
from traces.datamodel.schema import SCHEMA_VERSION, TABLES, TableSchema
from traces.errors import BadInput
from traces.files.jsonio import dump_json, read_json
from traces.files.outputs import StagedDir
from traces.files.paths import input_dir, input_file

if TYPE_CHECKING:  # pandas loads only where a frame is built (``trace info`` stays fast)
    import pandas as pd

META = "meta.json"
RECORDING_TABLES = ("requests", "steps", "step_items", "preemptions", "instances")  # checked together (consistency)
ROW_GROUP_ROWS = 1 << 20


def _read_rows(pf: pq.ParquetFile, columns: list[str] | None, head: int | None, request_ids) -> pa.Table:
    """The whole file, its first ``head`` rows, or its rows of ``request_ids``."""
    if head is None and request_ids is None:
        return pf.read(columns=columns)
    import pyarrow.compute as pc

    read_cols = columns if columns is None or request_ids is None or "request_id" in columns \
        else [*columns, "request_id"]
    keep = None if request_ids is None else pa.array(request_ids, type=pa.int64())
    parts, rows = [], 0
    for batch in pf.iter_batches(batch_size=1 << 16, columns=read_cols):
        if keep is not None:
            batch = batch.filter(pc.is_in(batch.column("request_id").cast(pa.int64()), value_set=keep))
        if head is not None:
            batch = batch.slice(0, head - rows)
        parts.append(batch)
        rows += batch.num_rows
        if head is not None and rows >= head:
            break
    table = pa.Table.from_batches(parts, schema=pf.schema_arrow if read_cols is None else None) if parts \
        else pf.schema_arrow.empty_table()
    if columns is not None:
        table = table.select(columns)
    return table


def table_path(trace_dir: Path, name: str) -> Path:
    return Path(trace_dir) / f"{name}.parquet"


class TableWriter:
    """Streams validated chunks of one table into a Parquet file."""

    def __init__(self, path: Path, schema: TableSchema):
        self.path = path
        self.schema = schema
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._arrow_schema: pa.Schema | None = None

    def write(self, df: pd.DataFrame) -> None:
        table = to_arrow(df, self.schema)
        if self._writer is None:
            self._arrow_schema = table.schema
            self._writer = pq.ParquetWriter(self.path, table.schema, compression="zstd")
        elif table.schema != self._arrow_schema:
            table = table.cast(self._arrow_schema)
        self._writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
        self.rows += len(df)

    def close(self) -> None:
        if self._writer is None:
            # an empty table still gets a file with the required columns
            empty = self.schema.arrow_schema(self.schema.required).empty_table()
            self._writer = pq.ParquetWriter(self.path, empty.schema, compression="zstd")
            self._writer.write_table(empty)
        self._writer.close()


class TraceWriter:
    """Builds a trace in a temporary directory and moves it into place.

    Use as a context manager; on any exception the temporary directory is
    removed and ``out`` is left untouched.
    """

    def __init__(self, out: str | Path, force: bool = False):
        self.staged = StagedDir(out, force)
        self.out, self.tmp = self.staged.out, self.staged.tmp
        self.rows: dict[str, int] = {}
        self.meta: dict[str, Any] = {}

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.staged.abort()  # removes the staging directory and releases the output lock
            return
        self._finish()

    def write_table(self, name: str, df: pd.DataFrame, source: str | None = None) -> None:
        """Validate a whole table and write it a row group at a time: the
        same bytes as one write (chunks of exactly ``ROW_GROUP_ROWS`` rows are
        the writer's own row groups), with one row group's Arrow copy in
        memory, not the table's (an hour of fleet traffic: ~0.5 GB)."""
        schema = TABLES[name]
        validate_frame(df, schema, source or str(table_path(self.out, name)))
        with self.table(name) as tw:
            for k in range(0, max(len(df), 1), ROW_GROUP_ROWS):
                tw.write(df.iloc[k:k + ROW_GROUP_ROWS])

    @contextmanager
    def table(self, name: str) -> Iterator[TableWriter]:
        """Stream a table chunk by chunk (the caller validates chunks against
        its source so errors name the source's rows)."""
        tw = TableWriter(table_path(self.tmp, name), TABLES[name])
        try:
            yield tw
        finally:
            tw.close()
        self.rows[name] = tw.rows

    def _finish(self) -> None:
        meta = {
            "schema_version": SCHEMA_VERSION,
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            **self.meta,
            "tables": dict(sorted(self.rows.items())),
        }
        (self.tmp / META).write_text(dump_json(meta, indent=2, sort_keys=False, default=str) + "\n")
        self.staged.commit()


class Trace:
    """A trace directory opened for reading."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta_path = self.path / META
        if not self.path.is_dir():
            raise BadInput(self.path, None, "trace", "not a directory")
        input_dir(self.path, "trace")  # listable
        if not meta_path.is_file():
            raise BadInput(meta_path, None, "meta.json", "missing: not a latroute trace directory")
        meta = read_json(meta_path, "meta.json")
        if not isinstance(meta, dict):
            raise BadInput(meta_path, None, "meta.json", f"not a JSON object (a {_json_kind(meta)})")
        self.meta: dict[str, Any] = meta
        check_meta(meta, meta_path)
        version = self.meta.get("schema_version")
        if version != SCHEMA_VERSION:
            raise BadInput(meta_path, None, "schema_version", f"{version!r} is not supported (expected {SCHEMA_VERSION})")
        for n in TABLES:  # a table that is there but not a regular file (FIFO, directory, device) is refused,
            p = table_path(self.path, n)  # never read as absent
            if os.path.lexists(p):
                input_file(p, n)
        self.tables = [n for n in TABLES if table_path(self.path, n).is_file()]
        self._consistent: bool | None = None  # None: not checked yet; False: being checked
        if "requests" not in self.tables and "steps" not in self.tables:
            raise BadInput(self.path, None, "requests", "trace has neither requests.parquet nor steps.parquet")

    def has(self, name: str) -> bool:
        return name in self.tables

    def file(self, name: str) -> Path:
        return table_path(self.path, name)

    def parquet(self, name: str) -> pq.ParquetFile:
        """The table's Parquet file, refused unless its columns are the
        schema's: every required column present, each of a compatible type
        (so another table's file, or a string-typed count, is named here
        rather than failing later)."""
        path = self.file(name)
        with open(input_file(path, name), "rb") as f:  # the footer can be whole when the head is not
            head = f.read(4)
        if head != b"PAR1":
            raise BadInput(path, None, name, "not a Parquet file (it does not start with PAR1)")
        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise BadInput(path, None, name, f"not a Parquet file or truncated ({str(e).splitlines()[0]})") from None
        check_arrow_schema(pf.schema_arrow, TABLES[name], path)
        return pf

    def columns(self, name: str) -> list[str]:
        return self.parquet(name).schema_arrow.names

    def read(self, name: str, columns: list[str] | None = None, validate: bool = True, head: int | None = None,
             request_ids=None) -> pd.DataFrame:
        """Read a table into pandas, checked against the schema: whole, or
        only its first ``head`` rows, or only the rows whose request_id is
        in ``request_ids``. The last two stream the file a batch at a time,
        so a sweep cell of 2,000 requests from a fleet-sized trace (an hour
        at 256 q/s: 0.9M requests, 2.8M quality rows) holds its own rows,
        not the whole trace."""
        path = self.file(name)
        if not path.is_file():
            raise BadInput(path, None, name, "table not present in this trace")
        pf = self.parquet(name)
        if columns is not None:
            missing = [c for c in columns if c not in pf.schema_arrow.names]
            if missing:
                raise BadInput(path, None, missing[0], "missing column")
        try:
            df = _read_rows(pf, columns, head, request_ids).to_pandas()
        except (pa.ArrowInvalid, OSError) as e:
            raise BadInput(path, None, name, f"not a Parquet file or truncated ({str(e).splitlines()[0]})") from None
        if validate:
            schema = TABLES[name]
            if columns is not None:
                schema = TableSchema(schema.name, tuple(c for c in schema.columns if c.name in columns),
                                     schema.sorted_by if schema.sorted_by in columns else None)
            validate_frame(df, schema, str(path))
            if name == "requests" and df.empty:  # every consumer of a workload needs one request
                raise BadInput(path, None, "requests", "no requests (the table has 0 rows)")
            for col in schema.columns:  # unsigned or narrower ints, now known to fit: int64 as the schema says
                if col.name in df and pa.types.is_integer(col.type) and df[col.name].dtype.kind in "iu" \
                        and df[col.name].dtype != "int64":
                    df[col.name] = df[col.name].astype("int64")
            if name in RECORDING_TABLES:
                self._check_consistent()
        return df

    def _check_consistent(self) -> None:
        """Once per opened trace, before any of a recording's tables is
        used: its tables agree with each other (``traces.checks.consistency``).
        The Parquet files may have been edited since they were written."""
        if self._consistent is not None:
            return
        self._consistent = False  # reading the tables below comes back here: nothing to do then
        if all(self.has(n) for n in ("requests", "steps", "step_items", "instances")):
            from traces.checks.consistency import Where, check_recording, check_request_times

            try:
                tables = {n: self.read(n) for n in RECORDING_TABLES if self.has(n)}
                where = {n: Where(str(self.file(n))) for n in RECORDING_TABLES}
                check_request_times(tables["requests"], where["requests"])
                check_recording(tables["requests"], tables["steps"], tables["step_items"],
                                tables.get("preemptions"), tables["instances"], where)
                self._check_hash_blocks(tables["requests"], tables["instances"])
            except BaseException:
                self._consistent = None  # refused: a later read refuses again
                raise
        self._consistent = True

    def _check_hash_blocks(self, requests: pd.DataFrame, instances: pd.DataFrame) -> None:
        """A recording's hash blocks map onto its engine's blocks only when
        one size divides the other (traces.datamodel.prefix_blocks)."""
        hbt = self.meta.get("hash_block_tokens")
        if not hbt or "hash_ids" not in requests:
            return
        for i, bs in enumerate(instances["block_size"].tolist()):
            if hbt % int(bs) and int(bs) % hbt:
                raise BadInput(self.path / META, None, "hash_block_tokens",
                               f"{hbt} and the block_size {int(bs)} of {self.file('instances')} row {i + 1}: "
                               "one must divide the other")

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with one view per table present."""
        con = duckdb.connect(":memory:")
        for name in self.tables:
            self.parquet(name)  # refuse corrupt files with a clear message
            lit = str(self.file(name).resolve()).replace("'", "''")
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM read_parquet('{lit}')")
        return con


def _json_kind(doc: Any) -> str:
    return "null" if doc is None else {list: "list", str: "string", bool: "boolean"}.get(type(doc), "number")


def _compatible(actual: pa.DataType, expected: pa.DataType) -> bool:
    if pa.types.is_dictionary(actual):
        actual = actual.value_type
    if pa.types.is_integer(expected):  # floats are checked to be exact whole numbers when read
        return pa.types.is_integer(actual) or pa.types.is_floating(actual) or pa.types.is_null(actual)
    if pa.types.is_floating(expected):
        return pa.types.is_integer(actual) or pa.types.is_floating(actual) or pa.types.is_null(actual)
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual) or pa.types.is_null(actual)
    if pa.types.is_boolean(expected):
        return pa.types.is_boolean(actual) or pa.types.is_null(actual)
    if pa.types.is_list(expected):
        if not (pa.types.is_list(actual) or pa.types.is_large_list(actual)):
            return pa.types.is_null(actual)
        if pa.types.is_integer(expected.value_type):  # ids: no whole-number check inside lists, so integers only
            return pa.types.is_integer(actual.value_type)
        return _compatible(actual.value_type, expected.value_type)
    return actual == expected


def check_arrow_schema(arrow: pa.Schema, schema: TableSchema, path: Path) -> None:
    """Refuse a Parquet file whose columns do not match ``schema``."""
    names = arrow.names
    for name in names:
        if names.count(name) > 1:
            raise BadInput(path, None, name, "duplicate column")
    for name in schema.required:
        if name not in names:
            raise BadInput(path, None, name, f"missing column (is this the {schema.name} table?)")
    for fld in arrow:
        col = schema.by_name.get(fld.name)
        if col is not None and not _compatible(fld.type, col.type):
            raise BadInput(path, None, fld.name, f"column of type {fld.type}, expected {col.type}")


def open_trace(path: str | Path) -> Trace:
    return Trace(path)
