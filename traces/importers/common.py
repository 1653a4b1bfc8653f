"""Shared pieces of the streaming importers: chunked CSV reading with source
line numbers, numeric parsing that names the offending cell, and a sink that
numbers, validates and writes request rows chunk by chunk.

Memory stays bounded by the chunk size whatever the source size.
"""
from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from traces.errors import BadInput
from traces.schema import REQUESTS, validate_frame
from traces.store import TableWriter

DEFAULT_CHUNK_ROWS = 500_000


@dataclass
class ImportOptions:
    """Options of ``latroute trace import``; each importer uses its own."""

    model: str | None = None  # burstgpt: keep only this model
    run: str | None = None  # lmbench: run id to import
    seed: int | None = None  # vllm-bench: seed of the arrival schedule
    keep_failed: bool = False  # burstgpt: keep zero-response (failed) rows
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    progress: Callable[[int], None] | None = None  # called with bytes of the source read so far


def require_file(path: Path) -> None:
    if not path.exists():
        raise BadInput(path, None, "file", "does not exist")
    if not path.is_file():
        raise BadInput(path, None, "file", "is not a regular file")
    if path.stat().st_size == 0:
        raise BadInput(path, 1, "file", "empty file")


def csv_header(path: Path) -> list[str]:
    require_file(path)
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        row = next(csv.reader(f), None)
    if not row:
        raise BadInput(path, 1, "header", "empty header line")
    return [c.strip() for c in row]


def require_columns(path: Path, header: list[str], needed: list[str]) -> None:
    for name in needed:
        if name not in header:
            raise BadInput(path, 1, name, f"missing column (header has: {', '.join(header)})")


_LINE_RE = re.compile(r"line (\d+)")


def csv_chunks(path: Path, columns: list[str], chunk_rows: int,
               progress: Callable[[int], None] | None = None) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Yield (chunk of string cells, source line number of each row).

    Blank lines are kept as rows of missing values so line numbers stay exact
    and a blank line is reported rather than skipped silently.
    """
    header = csv_header(path)
    require_columns(path, header, columns)
    line = 2
    got_rows = False
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise BadInput(path, None, "file", f"cannot be read ({e.strerror})") from None
    try:
        # explicit names (never an inferred index column); short rows read as
        # missing cells and are refused by the column checks; extra trailing
        # fields are ignored
        reader = pd.read_csv(fh, header=0, names=header, index_col=False, usecols=columns, dtype=str,
                             chunksize=chunk_rows, skip_blank_lines=False, keep_default_na=False, na_values=[""],
                             encoding_errors="replace")
        for chunk in reader:
            lines = np.arange(line, line + len(chunk))
            line += len(chunk)
            if progress is not None:
                progress(fh.tell())
            if len(chunk):
                got_rows = True
                yield chunk, lines
    except pd.errors.ParserError as e:
        m = _LINE_RE.search(str(e))
        raise BadInput(path, int(m.group(1)) if m else None, "row", f"malformed CSV ({str(e).strip()})") from None
    except pd.errors.EmptyDataError:
        raise BadInput(path, 1, "file", "empty file") from None
    finally:
        fh.close()
    if not got_rows:
        raise BadInput(path, 2, "file", "no data rows")


def numeric(df: pd.DataFrame, col: str, path: Path, lines: np.ndarray, integer: bool = True,
            nonneg: bool = True, name: str | None = None) -> np.ndarray:
    """Parse a column of strings; refuse the first missing, non-numeric,
    negative or (for counts) fractional cell."""
    raw = df[col]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        i = int(bad[0])
        cell = raw.iloc[i]
        why = "missing value" if pd.isna(cell) or str(cell).strip() == "" else f"not a number: {cell!r}"
        raise BadInput(path, int(lines[i]), name or col, why)
    if nonneg:
        bad = np.flatnonzero(values < 0)
        if bad.size:
            i = int(bad[0])
            raise BadInput(path, int(lines[i]), name or col, f"negative value {raw.iloc[i]}")
    if integer:
        bad = np.flatnonzero(values != np.floor(values))
        if bad.size:
            i = int(bad[0])
            raise BadInput(path, int(lines[i]), name or col, f"not a whole number: {raw.iloc[i]}")
        return values.astype(np.int64)
    return values


class RequestSink:
    """Numbers request rows, checks them against the schema (including
    sortedness across chunk boundaries) and streams them to Parquet."""

    def __init__(self, writer: TableWriter, source: Path, names: dict[str, str] | None = None):
        self.writer = writer
        self.source = source
        self.names = names or {}  # schema column -> source column, for messages
        self.next_id = 0
        self.prev_arrival: float | None = None

    def write(self, df: pd.DataFrame, lines: np.ndarray) -> None:
        if df.empty:
            return
        df = df.copy()
        df.insert(0, "request_id", np.arange(self.next_id, self.next_id + len(df), dtype=np.int64))
        try:
            validate_frame(df, REQUESTS, str(self.source), row_of=lambda i: int(lines[i]),
                           prev_sorted=self.prev_arrival)
        except BadInput as e:
            raise BadInput(e.file, e.row, self.names.get(e.column, e.column), e.reason) from None
        self.writer.write(df)
        self.next_id += len(df)
        self.prev_arrival = float(df["arrival_s"].iloc[-1])

    @property
    def rows(self) -> int:
        return self.next_id


def json_number(value, key: str, path: Path, row: int | None, integer: bool = False) -> float:
    """Check one number read from JSON; refuse missing, non-numeric,
    non-finite, negative or (for counts) fractional values."""
    if value is None:
        raise BadInput(path, row, key, "missing value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise BadInput(path, row, key, f"not a number: {value!r}")
    if value < 0:
        raise BadInput(path, row, key, f"negative value {value}")
    if integer and value != int(value):
        raise BadInput(path, row, key, f"not a whole number: {value}")
    return value


def jsonl_records(path: Path) -> Iterator[tuple[int, dict, int]]:
    """Yield (line number, object, bytes read so far) for a JSON-lines file,
    refusing blank lines, invalid JSON and non-objects by line."""
    require_file(path)
    read = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line, text in enumerate(f, start=1):
            read += len(text)
            if not text.strip():
                raise BadInput(path, line, "line", "blank line")
            try:
                rec = json.loads(text)
            except json.JSONDecodeError as e:
                raise BadInput(path, line, "line", f"not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise BadInput(path, line, "line", "not a JSON object")
            yield line, rec, read
