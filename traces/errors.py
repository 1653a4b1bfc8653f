"""The one error type for bad input.

Users feed latroute files they did not write (production traces, benchmark
JSON), so a refusal must point at the exact place to look: file, row and
column. The CLI turns this exception into a single line and exit status 2.
"""
from __future__ import annotations

from pathlib import Path


class BadInput(Exception):
    """Input that latroute refuses to read.

    ``row`` is 1-based: the line number for text formats (CSV, JSONL; the CSV
    header is line 1), the element number for JSON arrays and the row number
    for Parquet tables. ``None`` means the problem concerns the whole file.
    """

    def __init__(self, file: str | Path, row: int | None, column: str, reason: str):
        self.file = str(file)
        self.row = row
        self.column = column
        self.reason = reason
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file if self.row is None else f"{self.file}:{self.row}"
        return f"{where}: {self.column}: {self.reason}"


class BadOption(BadInput):
    """A command-line option (or combination) that latroute refuses; shown
    as ``error: OPTION: reason`` like any other bad input."""

    def __init__(self, option: str, reason: str):
        super().__init__(option, None, option, reason)

    def __str__(self) -> str:
        return f"{self.column}: {self.reason}"
