"""Shared pieces of the streaming importers: chunked CSV reading with source
line numbers, numeric parsing that names the offending cell, and a sink that
numbers, validates and writes request rows chunk by chunk.

Memory stays bounded by the chunk size whatever the source size.
"""
from __future__ import annotations

import csv
import math
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from traces.checks.frame_checks import validate_frame
from traces.datamodel.limits import MAX_TIME_S, MAX_TOKENS, shown
from traces.datamodel.schema import REQUESTS
from traces.errors import BadInput
from traces.files.jsonio import parse_json
from traces.files.paths import LINE_MAX_BYTES, UTF8_BOM, input_file
from traces.store import TableWriter

DEFAULT_CHUNK_ROWS = 500_000


@dataclass
class ImportOptions:
    """Options of ``latroute trace import``; each importer uses its own."""

    model: str | None = None  # burstgpt: keep only this model
    run: str | None = None  # lmbench: run id to import
    seed: int | None = None  # vllm-bench: seed of the arrival schedule
    keep_failed: bool = False  # burstgpt: keep zero-response (failed) rows
    engine: tuple[str, ...] = ()  # request-level formats: KEY=VALUE engine settings the source lacks or overrides
    accept_unmodelled: tuple[str, ...] = ()  # request-level formats: unmodelled settings to import anyway
    allow_incomplete: bool = False  # import a run that logged fewer requests than it sent
    session_prefix: bool = True  # lmbench: derive prompt hash_ids from sessions whose turns carry the conversation
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    progress: Callable[[int], None] | None = None  # called with bytes of the source read so far


def require_file(path: Path) -> None:
    """A regular file latroute may read (traces.files.paths: no FIFOs, devices,
    directories, unreadable files), not empty."""
    input_file(path)
    if path.stat().st_size == 0:
        raise BadInput(path, 1, "file", "empty file")


def text_lines(path: Path) -> Iterator[tuple[int, str, int]]:
    """Yield (1-based line, text, bytes read so far) of a UTF-8 text file,
    streaming: a line that is not UTF-8 or is longer than
    ``traces.files.paths.LINE_MAX_BYTES`` is refused with its row (the rule of
    ``traces.files.paths.decode_text``, which needs the whole file in memory; a
    leading UTF-8 byte-order mark is stripped)."""
    require_file(path)
    read = 0
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise BadInput(path, None, "file", f"cannot be read ({e.strerror or e})") from None
    with fh:
        # every line end pandas reads as one: \n, \r\n and a bare \r (old Mac files; such a file reads as
        # one "line" of \n-split bytes, and csv refused the header's embedded \r as an internal error)
        pieces = (p for raw in fh for p in (raw.splitlines(keepends=True) if b"\r" in raw[:-2] else (raw,)))
        for line, raw in enumerate(pieces, start=1):
            read += len(raw)
            if line == 1 and raw.startswith(UTF8_BOM):
                raw = raw[len(UTF8_BOM):]
            if len(raw.rstrip(b"\r\n")) > LINE_MAX_BYTES:
                raise BadInput(path, line, "line", f"longer than {LINE_MAX_BYTES} bytes (limit per line)")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise BadInput(path, line, "encoding",
                               f"not UTF-8 (byte 0x{raw[e.start]:02x}); save the file as UTF-8") from None
            yield line, text, read


def check_text(path: Path) -> None:
    """Refuse a text file with a non-UTF-8 or over-long line (its row), before pandas reads it."""
    for _ in text_lines(path):
        pass


def csv_header(path: Path) -> list[str]:
    require_file(path)
    first = next(text_lines(path), None)
    row = next(csv.reader([first[1]]), None) if first else None
    if not row:
        raise BadInput(path, 1, "header", "empty header line")
    return [c.strip() for c in row]


def refuse_duplicate_columns(path: Path, header: list[str]) -> None:
    """A header naming a column twice is ambiguous (which one is the data?)."""
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise BadInput(path, 1, name, "duplicate column in the header")
        seen.add(name)


def require_columns(path: Path, header: list[str], needed: list[str]) -> None:
    for name in needed:
        if name not in header:
            raise BadInput(path, 1, name, f"missing column (header has: {', '.join(header)})")


_LINE_RE = re.compile(r"line (\d+)")
_CONSTANT_RE = re.compile(r'"([^"\\]{1,100})"\s*:\s*(-?Infinity|NaN)\b')


def csv_chunks(path: Path, columns: list[str], chunk_rows: int,
               progress: Callable[[int], None] | None = None) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Yield (chunk of string cells, source line number of each row).

    Blank lines are kept as rows of missing values so line numbers stay exact
    and a blank line is reported rather than skipped silently.
    """
    header = csv_header(path)
    require_columns(path, header, columns)
    refuse_duplicate_columns(path, header)
    check_text(path)
    line = 2
    got_rows = False
    try:
        fh = open(path, "rb")
    except OSError as e:
        raise BadInput(path, None, "file", f"cannot be read ({e.strerror})") from None
    try:
        # explicit names (never an inferred index column); short rows read as
        # missing cells and are refused by the column checks; a row with more
        # fields than the header fills the sentinel column (or, with more still,
        # makes pandas warn of lost data) and is refused with its line: with
        # usecols, or without the sentinel, pandas drops extra fields silently
        reader = iter(pd.read_csv(fh, header=None, skiprows=1, names=[*header, _EXTRA], index_col=False, dtype=str,
                                  chunksize=chunk_rows, skip_blank_lines=False, keep_default_na=False,
                                  na_values=[""]))
        while True:
            with warnings.catch_warnings():
                warnings.simplefilter("error", pd.errors.ParserWarning)
                try:
                    chunk = next(reader)
                except StopIteration:
                    break
                except pd.errors.ParserWarning:
                    raise BadInput(path, _long_row(path, len(header)), "row",
                                   f"more fields than the header's {len(header)}") from None
            lines = np.arange(line, line + len(chunk))
            extra = chunk[_EXTRA].notna().to_numpy()
            if extra.any():
                raise BadInput(path, int(lines[int(np.flatnonzero(extra)[0])]), "row",
                               f"more fields than the header's {len(header)}")
            chunk = chunk[columns]
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


_EXTRA = "\x00extra field"  # a column name no header has


def _long_row(path: Path, fields: int) -> int | None:
    """The line of the first row with more than ``fields`` fields."""
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        for row in reader:
            if len(row) > fields:
                return reader.line_num
    return None


def numeric(df: pd.DataFrame, col: str, path: Path, lines: np.ndarray, integer: bool = True,
            nonneg: bool = True, name: str | None = None, maximum: float | None = None,
            allow_missing: np.ndarray | None = None) -> np.ndarray:
    """Parse a column of strings; refuse the first missing, non-numeric,
    negative, too large (``maximum``: MAX_TOKENS for counts, MAX_TIME_S for
    times) or (for counts) fractional cell. The maximum is checked on the
    float value before any cast, so nothing wraps, and counts are far below
    2**53, so nothing near the limit was rounded. ``allow_missing`` marks
    rows whose empty cell is read as NaN (floats only)."""
    raw = df[col]
    limit = maximum if maximum is not None else (MAX_TOKENS if integer else MAX_TIME_S)
    with np.errstate(over="ignore"):
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    empty = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
    bad = ~np.isfinite(values)
    if allow_missing is not None:
        bad &= ~(empty & allow_missing)
    bad = np.flatnonzero(bad)
    if bad.size:
        i = int(bad[0])
        cell = raw.iloc[i]
        why = "missing value" if empty[i] else f"not a number: {shown(cell)}"
        raise BadInput(path, int(lines[i]), name or col, why)
    if nonneg:
        bad = np.flatnonzero(values < 0)
        if bad.size:
            i = int(bad[0])
            raise BadInput(path, int(lines[i]), name or col, f"negative value {shown(raw.iloc[i])}")
    bad = np.flatnonzero(values > limit)
    if bad.size:
        i = int(bad[0])
        raise BadInput(path, int(lines[i]), name or col,
                       f"value {shown(raw.iloc[i])} above the maximum {limit:g} (traces.datamodel.limits)")
    if integer:
        bad = np.flatnonzero(values != np.floor(values))
        if bad.size:
            i = int(bad[0])
            raise BadInput(path, int(lines[i]), name or col, f"not a whole number: {shown(raw.iloc[i])}")
        if np.isnan(values).any():  # allowed missing cells: a nullable int travels as float with NaN
            return values
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


def json_number(value, key: str, path: Path, row: int | None, integer: bool = False,
                maximum: float | None = None) -> float:
    """Check one number read from JSON; refuse missing, non-numeric,
    non-finite, negative, too large (``maximum``; default MAX_TOKENS for
    counts, MAX_TIME_S for times) or (for counts) fractional values. Python
    ints are compared exactly, so 2**63 is refused, never wrapped."""
    if value is None:
        raise BadInput(path, row, key, "missing value")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise BadInput(path, row, key, f"not a number: {shown(value)}")
    if value < 0:
        raise BadInput(path, row, key, f"negative value {shown(value)}")
    limit = maximum if maximum is not None else (MAX_TOKENS if integer else MAX_TIME_S)
    if value > limit:
        raise BadInput(path, row, key, f"value {shown(value)} above the maximum {limit:g} (traces.datamodel.limits)")
    if integer and value != int(value):
        raise BadInput(path, row, key, f"not a whole number: {value}")
    return value


def jsonl_records(path: Path) -> Iterator[tuple[int, dict, int]]:
    """Yield (line number, object, bytes read so far) for a JSON-lines file,
    refusing blank lines, invalid JSON and non-objects by line."""
    for line, text, read in text_lines(path):
        if not text.strip():
            raise BadInput(path, line, "line", "blank line")
        try:
            rec = parse_json(text, path, "line")
        except BadInput as e:  # the line of the file, not of the one-line document
            m = _CONSTANT_RE.search(text)
            if m:  # name the field that holds the NaN / Infinity
                raise BadInput(path, line, m.group(1), f"not a number: {m.group(2)} "
                                                       "(strict JSON has no NaN or Infinity)") from None
            raise BadInput(path, line, "line", e.reason) from None
        if not isinstance(rec, dict):
            raise BadInput(path, line, "line", "not a JSON object")
        yield line, rec, read
