"""What ``sweep --resume`` accepts in a sweep directory before it runs a cell.

A resumed sweep folds every part under ``cells/`` into ``results.parquet``,
so a part that is garbage, empty, truncated, renamed from another cell, or
left there from another sweep would either crash the sweep after its cells
ran or, worse, become a row of its results without a word. Every entry is
therefore checked when the sweep directory is opened, before any work, and
a bad one is refused naming it (exit 2): the user deletes it, and the next
``--resume`` runs that cell again. The final files the sweep will replace
(results.parquet, metrics.json, ...) must be regular files where present,
or the sweep would fail only at its very end.

Kept apart from ``harness.sweep.store`` (the layout and the writing) so
that module stays under the house size limit.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import re
import stat
from pathlib import Path

import pandas as pd

from traces.errors import BadInput
from traces.files.jsonio import parse_json
from traces.files.paths import input_file, read_bytes, special_kind

PART_MAX_BYTES = 64 << 20  # one cell's row: a part larger than this is not one latroute wrote
TIMING_MAX_BYTES = 64 << 10
PART_NAME = re.compile(r"^([0-9a-f]{20})\.(parquet|timing\.json)$")
DEBRIS = re.compile(r"^\..+\.tmp-\d+-")  # a killed writer's temporary (removed by clean_debris_in)
CELL_FIELDS = ("rate", "router", "delta_per_us", "lam", "seed")
FINITE_COLUMNS = ("rate", "delta_per_us", "lam", "seed", "requests", "ontime_utility", "slo_attainment",
                  "mean_utility")
NUMERIC_COLUMNS = FINITE_COLUMNS + ("interarrival_cv2", "ttft_mean_s")
TIMING_KEYS = ("wall_s", "speedup", "mean_decision_us")
RESUME = "delete it and --resume runs that cell again"


def key_of(cell: dict) -> str:
    """``harness.sweep.store.cell_key`` of a cell given as its dict."""
    return hashlib.sha256(json.dumps(cell, sort_keys=True).encode()).hexdigest()[:20]


def _kind(path: Path) -> str | None:
    """None for a regular file; else what it is (refused where a file belongs)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return "a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "a directory"
    return special_kind(st.st_mode)


def check_final_files(out: Path, names) -> None:
    """Each of ``names`` in ``out`` is absent or a regular file."""
    for name in names:
        p = out / name
        if os.path.lexists(p) and (kind := _kind(p)):
            raise BadInput(p, None, name, f"is {kind}, not a file a latroute sweep wrote (remove it, or --force)")


def read_part(path: Path) -> pd.DataFrame:
    """A cell part as a frame, or BadInput naming it."""
    data = read_bytes(path, "cell part", PART_MAX_BYTES, follow_links=False)
    try:
        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(data)).to_pandas()
    except Exception as e:  # pyarrow raises several types for bad files
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise BadInput(path, None, "cell part", f"not a Parquet file or truncated ({first}); {RESUME}") from None


def read_timing(path: Path) -> dict:
    """A cell's timing file: an object of numbers (or null: NaN when written)."""
    if not os.path.lexists(path):
        raise BadInput(path, None, "timing", "missing beside its cell part; delete the part and --resume runs "
                       "that cell again")
    data = read_bytes(path, "timing", TIMING_MAX_BYTES, follow_links=False)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(path, None, "timing", f"not UTF-8; {RESUME}") from None
    doc = parse_json(text, path, "timing")
    if not isinstance(doc, dict):
        raise BadInput(path, None, "timing", f"not a JSON object; {RESUME}")
    for k in TIMING_KEYS:
        v = doc.get(k)
        if k not in doc or (v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                               or abs(v) > 2.0**63)):
            raise BadInput(path, None, k, f"expected a number, got {v!r}; {RESUME}")
    return doc


def _check_row(path: Path, df: pd.DataFrame, cell: dict, arrival: str) -> None:
    if len(df) != 1:
        raise BadInput(path, None, "cell part", f"{len(df)} rows, not one cell's row; {RESUME}")
    if len(set(df.columns)) != len(df.columns):
        raise BadInput(path, None, "cell part", f"duplicate column names; {RESUME}")
    for col in (*CELL_FIELDS, "arrival", *NUMERIC_COLUMNS):
        if col not in df.columns:
            raise BadInput(path, 1, col, f"missing: not a cell part this sweep wrote; {RESUME}")
    for col in NUMERIC_COLUMNS:
        if df[col].dtype.kind not in "iuf":
            raise BadInput(path, 1, col, f"not a number (type {df[col].dtype}); {RESUME}")
        v = float(df[col].iloc[0])
        if math.isinf(v) or abs(v) > 2.0**63 or (col in FINITE_COLUMNS and math.isnan(v)):
            raise BadInput(path, 1, col, f"{v} is not a value a cell has; {RESUME}")
    for col in df.columns:
        if df[col].dtype.kind == "f" and df[col].abs().gt(2.0**63).any():
            raise BadInput(path, 1, col, f"{df[col].iloc[0]} is not a value a cell has; {RESUME}")
        if df[col].dtype.kind not in "iufbO" or (df[col].dtype.kind == "O" and not isinstance(
                df[col].iloc[0], (str, type(None)))):
            raise BadInput(path, 1, col, f"holds a {df[col].dtype} value, not a number or text; {RESUME}")
    row = df.iloc[0]
    for col in CELL_FIELDS:
        if row[col] != cell[col]:
            raise BadInput(path, 1, col, f"{row[col]!r} is not its cell's {cell[col]!r} (a part renamed from "
                           f"another cell); {RESUME}")
    if row["arrival"] != arrival:
        raise BadInput(path, 1, "arrival", f"{row['arrival']!r} is not this sweep's {arrival!r} (a part of "
                       f"another sweep); {RESUME}")


def check_cells(cells: Path, spec_doc: dict) -> None:
    """Every entry of ``cells/`` is a part (result row + timing) of one of
    this sweep's cells, whole and consistent with it; else BadInput naming
    the first bad entry. A killed writer's temporaries are left for
    ``clean_debris_in``; a timing file without its part (a kill between the
    two writes) is accepted: the cell runs again and replaces it."""
    if not os.path.lexists(cells):
        return
    kind = _kind(cells)
    if kind != "a directory":
        raise BadInput(cells, None, "cells", f"is {kind or 'a file'}, not the sweep's directory of cell parts "
                       "(remove it, or --force)")
    by_key = {key_of(c): c for c in spec_doc.get("cells", [])}
    arrival = spec_doc.get("spec", {}).get("arrival")
    try:
        names = sorted(os.listdir(cells))
    except OSError as e:
        raise BadInput(cells, None, "cells", f"cannot be listed ({e.strerror or e})") from None
    for name in names:
        if DEBRIS.match(name):
            continue
        path = cells / name
        m = PART_NAME.match(name)
        if not m:
            raise BadInput(path, None, "cell part", "not a part of this sweep (expected KEY.parquet or "
                           "KEY.timing.json); delete it")
        if m.group(1) not in by_key:
            raise BadInput(path, None, "cell part", "names no cell of this sweep (a part of another sweep); "
                           "delete it")
        kind = _kind(path)
        if kind:
            raise BadInput(path, None, "cell part", f"is {kind}, not a file; {RESUME}")
        if m.group(2) == "parquet":
            input_file(path, "cell part", follow_links=False)
            _check_row(path, read_part(path), by_key[m.group(1)], arrival)
            read_timing(cells / f"{m.group(1)}.timing.json")
