"""The checks every table must pass before it is written (``validate_frame``)
and its cast to the schema's exact Arrow types (``to_arrow``): the tables
themselves are in ``traces.datamodel.schema``.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from traces.datamodel.limits import INT64_MAX, MAX_ID, MAX_TIME_S, shown
from traces.datamodel.schema import Column, TableSchema
from traces.errors import BadInput

if TYPE_CHECKING:  # pandas loads where a frame is validated, not on import
    import pandas as pd


def _is_numeric(col: Column) -> bool:
    return pa.types.is_integer(col.type) or pa.types.is_floating(col.type)


def column_max(col: Column) -> float:
    """The largest value a numeric column accepts (traces.datamodel.limits): its own
    ``maximum``, else MAX_ID for integers and MAX_TIME_S for times (``_s``)."""
    if col.maximum is not None:
        return col.maximum
    if pa.types.is_integer(col.type):
        return MAX_ID
    return MAX_TIME_S if col.name.endswith("_s") else float("inf")


def first_true(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


def _exact_integers(s: pd.Series, col: Column, file: str, row_of: Callable[[int], int]) -> None:
    """Refuse integer cells that are not exactly an int64 within the
    column's range: strings, fractions, floats above 2**53 (already
    rounded), unsigned or Python integers beyond int64."""
    kind = s.dtype.kind
    limit = column_max(col)
    if kind == "u":
        bad = first_true(s.to_numpy() > np.uint64(min(limit, INT64_MAX)))
        if bad is not None:
            raise BadInput(file, row_of(bad), col.name, f"value {int(s.iloc[bad])} above the maximum {int(limit)}")
    elif kind == "f":
        v = s.to_numpy(dtype=np.float64)
        with np.errstate(invalid="ignore"):
            bad = first_true(np.isfinite(v) & ((np.abs(v) > 2.0**53) | (v != np.floor(v))))
        if bad is not None:
            why = "not a whole number" if abs(v[bad]) <= 2.0**53 else "does not fit exactly (beyond 2**53)"
            raise BadInput(file, row_of(bad), col.name, f"{why}: {v[bad]!r}")
    elif kind in ("O", "T", "U", "b"):
        for i, x in enumerate(s.tolist()):
            if x is None or (isinstance(x, float) and np.isnan(x)):
                continue
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer, float)):
                raise BadInput(file, row_of(i), col.name, f"not an integer: {shown(x)}")
            if isinstance(x, float) and (x != int(x) or abs(x) > 2.0**53):
                raise BadInput(file, row_of(i), col.name, f"not an exact whole number: {shown(x)}")
            if not -INT64_MAX - 1 <= int(x) <= INT64_MAX:
                raise BadInput(file, row_of(i), col.name, f"{shown(x)} does not fit int64")


def _numbers(s: pd.Series, col: Column, file: str, row_of: Callable[[int], int]) -> np.ndarray:
    """The column as float64 for the range checks; a non-null cell that is
    not a number (a string in a numeric column) is refused, never read as NaN."""
    import pandas as pd

    if s.dtype.kind in ("O", "T", "U", "b") and pd.api.types.infer_dtype(s, skipna=True) not in (
            "integer", "floating", "mixed-integer-float", "empty"):
        for i, x in enumerate(s.tolist()):
            if x is None or (isinstance(x, float) and np.isnan(x)):
                continue
            if isinstance(x, (bool, np.bool_, str, bytes)) or not isinstance(x, (int, float, np.number)):
                raise BadInput(file, row_of(i), col.name, f"not a number: {shown(x)}")
    if pa.types.is_integer(col.type):
        _exact_integers(s, col, file, row_of)
    return _as_float(s)


def _as_float(s: pd.Series) -> np.ndarray:
    """A numeric column as float64, NaN where empty (checked by ``_numbers``)."""
    import pandas as pd

    with np.errstate(over="ignore"):
        return pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def validate_frame(
    df: pd.DataFrame,
    schema: TableSchema,
    file: str,
    row_of: Callable[[int], int] = lambda i: i + 1,
    prev_sorted: float | None = None,
) -> None:
    """Refuse a frame that breaks ``schema``.

    ``row_of`` maps a 0-based position in ``df`` to the row number to report
    (importers pass the source file's line numbers); ``prev_sorted`` is the
    last value of the sorted column in the previous chunk when streaming.
    """
    if df.columns.duplicated().any():
        raise BadInput(file, None, str(df.columns[df.columns.duplicated()][0]), "duplicate column")
    for name in schema.required:
        if name not in df.columns:
            raise BadInput(file, None, name, "missing column")
    # the checks run in three passes (cells, then order, then ranges) but hold one column's floats at a time,
    # not every numeric column's (a served hour of fleet traffic: 3.7M rows, ~0.45 GB held at once)
    numeric_cols: list[Column] = []
    v = None
    for col in schema.columns:
        if col.name not in df.columns:
            continue
        if not _is_numeric(col):
            _check_other(df[col.name], col, file, row_of)
            continue
        values = _numbers(df[col.name], col, file, row_of)
        if not col.nullable:
            bad = first_true(np.isnan(values))
            if bad is not None:
                raise BadInput(file, row_of(bad), col.name, "missing or non-numeric value (NaN)")
        bad = first_true(np.isinf(values))
        if bad is not None:
            raise BadInput(file, row_of(bad), col.name, "infinite value")
        numeric_cols.append(col)
        if col.name == schema.sorted_by:
            v = values
        del values
    if schema.sorted_by in df.columns and len(df):
        # before the sign check: an out-of-order time is better reported as
        # such than as a negative offset from the first row
        if prev_sorted is not None and v[0] < prev_sorted:
            raise BadInput(file, row_of(0), schema.sorted_by, "not sorted (smaller than the previous row)")
        bad = first_true(np.diff(v) < 0)
        if bad is not None:
            raise BadInput(file, row_of(bad + 1), schema.sorted_by, "not sorted (smaller than the previous row)")
    del v
    for col in numeric_cols:
        values = _as_float(df[col.name])
        if col.nonneg or col.positive:
            bad = first_true(values <= 0 if col.positive else values < 0)
            if bad is not None:
                sign = "must be positive, got" if col.positive else "negative value"
                raise BadInput(file, row_of(bad), col.name, f"{sign} {_cell(df[col.name], bad)}")
        limit = column_max(col)
        bad = first_true(values > limit)
        if bad is not None:
            raise BadInput(file, row_of(bad), col.name,
                           f"value {_cell(df[col.name], bad)} above the maximum {limit:g} (traces.datamodel.limits)")
        if col.unique:
            _check_unique(df[col.name], col, file, row_of)
    if schema.name == "steps":
        check_steps(df, file, row_of)
    if schema.name == "requests":
        check_request_cells(df, file, row_of)
    if schema.name == "instances" and {"max_num_seqs", "max_num_batched_tokens"} <= set(df.columns) and len(df):
        seqs = pd_float(df["max_num_seqs"])
        budget = pd_float(df["max_num_batched_tokens"])
        bad = first_true(seqs > budget)
        if bad is not None:  # estimators.engine.config.InstanceConfig refuses it too, as vLLM does
            raise BadInput(file, row_of(bad), "max_num_seqs", f"{int(seqs[bad])} is above max_num_batched_tokens "
                                                              f"{int(budget[bad])} (vLLM requires it at most that)")
    if schema.name == "quality" and {"request_id", "model"} <= set(df.columns):
        dup = df.duplicated(["request_id", "model"], keep="first").to_numpy()
        bad = first_true(dup)
        if bad is not None:
            raise BadInput(file, row_of(bad), "request_id", f"request {_cell(df['request_id'], bad)} has a second "
                                                            f"row for model {_cell(df['model'], bad)}")


def check_request_cells(df: pd.DataFrame, file: str, row_of: Callable[[int], int] = lambda i: i + 1) -> None:
    """What a request row holds beyond its cells' ranges: a cache hit within
    its prompt, and prefix-block ids in [0, 2**62) (the kernel numbers a
    request's own blocks from 2**62 up: a trace id there would alias one)."""
    from traces.datamodel.prefix_blocks import MAX_TRACE_ID

    if "cached_tokens" in df and "prompt_tokens" in df and len(df):
        cached = pd_float(df["cached_tokens"])
        prompt = pd_float(df["prompt_tokens"])
        with np.errstate(invalid="ignore"):
            bad = first_true(cached > prompt)
        if bad is not None:
            raise BadInput(file, row_of(bad), "cached_tokens",
                           f"{int(cached[bad])} cached tokens, above the prompt's {int(prompt[bad])} (prompt_tokens)")
    if "hash_ids" in df and len(df):
        cells = df["hash_ids"].tolist()
        for i, h in enumerate(cells):
            if h is None or (isinstance(h, float) and np.isnan(h)):
                continue
            if not isinstance(h, (list, tuple, np.ndarray)):
                continue  # the column's type is checked by _check_other
            ids = np.asarray(h)
            if ids.size == 0:
                continue
            if ids.dtype.kind not in "iu":
                if not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in h):
                    raise BadInput(file, row_of(i), "hash_ids", f"not a list of integers: {shown(list(h))}")
                ids = np.array([int(x) for x in h], dtype=object)
            low, high = ids.min(), ids.max()
            if low < 0 or high > MAX_TRACE_ID:
                raise BadInput(file, row_of(i), "hash_ids",
                               f"hash id {int(low) if low < 0 else int(high)} outside [0, 2**62)")


def pd_float(s: pd.Series) -> np.ndarray:
    """A numeric column as float64, missing cells NaN (checked to be numbers already)."""
    import pandas as pd

    return pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _cell(s: pd.Series, i: int) -> str:
    """The exact cell (an int64 stays exact), cut for a one-line message."""
    x = s.iloc[i]
    return shown(int(x) if isinstance(x, (int, np.integer)) else x)


def _check_unique(s: pd.Series, col: Column, file: str, row_of: Callable[[int], int]) -> None:
    dup = s.duplicated(keep="first").to_numpy() & s.notna().to_numpy()
    bad = first_true(dup)
    if bad is not None:
        raise BadInput(file, row_of(bad), col.name, f"duplicate value {_cell(s, bad)}")


def _check_other(s: pd.Series, col: Column, file: str, row_of: Callable[[int], int]) -> None:
    """Strings, booleans and lists: present where required, of the right
    kind (a number in a string column is a column of another table), one of
    the column's choices."""
    import pandas as pd

    missing = s.isna().to_numpy()
    if not col.nullable:
        bad = first_true(missing)
        if bad is not None:
            raise BadInput(file, row_of(bad), col.name, "missing value")
    if pa.types.is_string(col.type):
        kinds = (str,)
    elif pa.types.is_boolean(col.type):
        kinds = (bool, np.bool_)
    else:
        kinds = (list, tuple, np.ndarray)
    if s.dtype.kind not in ("O", "T", "U", "b"):
        bad = first_true(~missing)
        if bad is not None:
            raise BadInput(file, row_of(bad), col.name, f"not a {col.type} value: {_cell(s, bad)}")
        return
    inferred = pd.api.types.infer_dtype(s, skipna=True)
    fast = inferred == "empty" or (inferred == "string" and str in kinds) or (inferred == "boolean" and bool in kinds)
    if fast and col.choices is not None:
        bad = first_true(~missing & ~s.isin(col.choices).to_numpy())
        if bad is not None:
            raise BadInput(file, row_of(bad), col.name, f"{_cell(s, bad)} is not one of {', '.join(col.choices)}")
    for i, x in enumerate([] if fast else s.tolist()):
        if missing[i]:
            continue
        if not isinstance(x, kinds):
            raise BadInput(file, row_of(i), col.name, f"not a {col.type} value: {shown(x)}")
        if col.choices is not None and x not in col.choices:
            raise BadInput(file, row_of(i), col.name, f"{shown(x)} is not one of {', '.join(col.choices)}")
    if col.unique:
        _check_unique(s, col, file, row_of)


def to_arrow(df: pd.DataFrame, schema: TableSchema) -> pa.Table:
    """Cast a validated frame to the schema's exact Arrow types, in schema
    order, dropping pandas metadata so the bytes depend only on the data."""
    unknown = [c for c in df.columns if c not in schema.by_name]
    if unknown:
        raise ValueError(f"{schema.name}: columns not in the schema: {unknown}")
    present = [c.name for c in schema.columns if c.name in df.columns]
    arrays = []
    for name in present:
        col = schema.by_name[name]
        s = df[name]
        if pa.types.is_integer(col.type):
            if s.isna().any():  # nullable ints travel as float with NaN in pandas
                arr = pa.array(s.to_numpy(dtype="float64", na_value=np.nan), from_pandas=True).cast(col.type)
            else:
                arr = pa.array(s.to_numpy(dtype="int64"), type=col.type)
        elif pa.types.is_list(col.type):
            arr = pa.array(list(s), type=col.type)
        else:
            arr = pa.array(s, type=col.type, from_pandas=True)
        arrays.append(arr)
    return pa.Table.from_arrays(arrays, schema=schema.arrow_schema(present))


# Step times come from clocks and from sums of floats (a twin's step ends at
# start + duration; the next starts there, recomputed): a microsecond of
# slack tells rounding from steps that really overlap.
STEP_TIME_SLACK_S = 1e-6


def check_steps(df: pd.DataFrame, file: str, row_of: Callable[[int], int] = lambda i: i + 1) -> None:
    """Refuse step times no engine could produce, per instance in step
    order: a repeated step number, a step that ends before it starts, and a
    step that starts before the previous one ended (steps of one engine
    never overlap; a later step starting earlier is the same fault)."""
    if not {"instance_id", "step", "start_s", "end_s"} <= set(df.columns) or df.empty:
        return
    inst = df["instance_id"].astype(str).to_numpy()
    step = df["step"].to_numpy(dtype=np.int64)
    start = df["start_s"].to_numpy(dtype=np.float64)
    end = df["end_s"].to_numpy(dtype=np.float64)
    bad = first_true(end < start - STEP_TIME_SLACK_S)
    if bad is not None:
        raise BadInput(file, row_of(bad), "end_s",
                       f"step {step[bad]} ends ({float(end[bad])!r}) before it starts ({float(start[bad])!r})")
    order = np.lexsort((np.arange(len(df)), step, inst))
    same = inst[order][1:] == inst[order][:-1]
    rows = order[1:]
    bad = first_true(same & (step[order][1:] == step[order][:-1]))
    if bad is not None:
        raise BadInput(file, row_of(int(rows[bad])), "step", f"step {step[rows[bad]]} appears twice")
    bad = first_true(same & (start[order][1:] < end[order][:-1] - STEP_TIME_SLACK_S))
    if bad is not None:
        i, prev = int(rows[bad]), int(order[bad])
        what = "starts before the previous step started" if start[i] < start[prev] else "overlaps the previous step"
        raise BadInput(file, row_of(i), "start_s",
                       f"step {step[i]} {what} (starts {float(start[i])!r}, step {step[prev]} ran "
                       f"{float(start[prev])!r}-{float(end[prev])!r})")
