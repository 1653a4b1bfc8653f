"""The trace data model: tables, column types and the checks every table
must pass before it is written.

One schema serves recorded, imported, generated and simulated traces, so any
consumer can rely on it: times are seconds since the trace start (float64),
token counts are int64, identifiers are int64 (requests) or strings
(instances). Optional columns may be absent from a file; when present they
obey the same checks.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from traces.errors import BadInput
from traces.limits import INT64_MAX, MAX_ENGINE, MAX_ID, MAX_TIME_S, MAX_TOKENS, shown

if TYPE_CHECKING:  # pandas loads where a frame is validated, not on import
    import pandas as pd

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Column:
    """One column: its Arrow type and what its values must satisfy."""

    name: str
    type: pa.DataType
    required: bool = True  # must be present in the table
    nullable: bool = False  # may hold nulls (NaN for floats)
    nonneg: bool = False  # numeric values must be >= 0
    doc: str = ""
    maximum: float | None = None  # None: traces.limits' default for the column's kind (column_max)
    positive: bool = False  # numeric values must be > 0 (engine settings)
    choices: tuple[str, ...] | None = None  # the only strings allowed
    unique: bool = False  # no value may repeat (ids)


@dataclass(frozen=True)
class TableSchema:
    name: str
    columns: tuple[Column, ...]
    sorted_by: str | None = None  # column that must be non-decreasing
    doc: str = ""
    by_name: dict[str, Column] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_name", {c.name: c for c in self.columns})

    @property
    def required(self) -> list[str]:
        return [c.name for c in self.columns if c.required]

    def arrow_schema(self, present: list[str]) -> pa.Schema:
        """Arrow schema for the columns ``present`` (in schema order)."""
        return pa.schema([pa.field(c.name, c.type, nullable=True) for c in self.columns if c.name in present])


I64, F64, STR, BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()

REQUESTS = TableSchema(
    "requests",
    (
        Column("request_id", I64, nonneg=True, unique=True, doc="unique id within the trace"),
        Column("arrival_s", F64, nullable=True, nonneg=True,
               doc="arrival time, seconds since trace start; null only when the source has none "
                   "(meta.json arrivals = 'unknown')"),
        Column("prompt_tokens", I64, nonneg=True, maximum=MAX_TOKENS),
        Column("output_tokens", I64, nonneg=True, maximum=MAX_TOKENS, doc="true output length"),
        Column("task", STR, required=False, nullable=True),
        Column("slo_ttft_s", F64, required=False, nullable=True, nonneg=True, doc="TTFT SLO tau_i"),
        Column("instance_id", STR, required=False, nullable=True, doc="where it was served"),
        Column("ttft_s", F64, required=False, nullable=True, nonneg=True, doc="measured time to first token"),
        Column("finish_s", F64, required=False, nullable=True, nonneg=True, doc="time the last token was produced"),
        Column("predicted_output_tokens", I64, required=False, nullable=True, nonneg=True, maximum=MAX_TOKENS),
        Column("added_s", F64, required=False, nullable=True, nonneg=True, doc="handed to the engine (recordings)"),
        Column("preemptions", I64, required=False, nullable=True, nonneg=True),
        Column("finish_reason", STR, required=False, nullable=True,
               doc="as vLLM names it: stop (its own end) or length (reached max_model_len); twin traces"),
        Column("hash_ids", pa.list_(I64), required=False, nullable=True,
               doc="prefix-chained block ids, one per meta.json hash_block_tokens prompt tokens "
                   "(traces.prefix_blocks maps them to engine blocks)"),
        Column("session", I64, required=False, nullable=True, nonneg=True, doc="multi-turn session (generated)"),
        Column("turn", I64, required=False, nullable=True, nonneg=True, doc="turn within its session, from 0"),
        Column("cached_tokens", I64, required=False, nullable=True, nonneg=True, maximum=MAX_TOKENS,
               doc="prefix-cache hit granted at first scheduling (recordings with prefix caching)"),
        Column("utility", F64, required=False, nullable=True, doc="realised utility where served (replays)"),
        Column("on_time", BOOL, required=False, nullable=True, doc="TTFT within the SLO (replays)"),
        Column("cost_micro_usd", F64, required=False, nullable=True, nonneg=True, doc="realised cost (replays)"),
        Column("acc", F64, required=False, nullable=True, doc="realised accuracy where served (replays)"),
        Column("client_id", STR, required=False, nullable=True, doc="id the client sent (X-Request-Id; loadgen)"),
        Column("status", STR, required=False, nullable=True, doc="ok | error (client-measured traces, loadgen)"),
        Column("error", STR, required=False, nullable=True, doc="why a request failed (loadgen)"),
        Column("e2e_s", F64, required=False, nullable=True, nonneg=True, doc="client end-to-end latency (loadgen)"),
        Column("itl_mean_s", F64, required=False, nullable=True, nonneg=True, doc="mean inter-token latency"),
        Column("itl_p50_s", F64, required=False, nullable=True, nonneg=True, doc="median inter-token latency"),
        Column("itl_p90_s", F64, required=False, nullable=True, nonneg=True, doc="p90 inter-token latency"),
        Column("itl_max_s", F64, required=False, nullable=True, nonneg=True, doc="largest inter-token latency"),
        Column("itls_s", pa.list_(F64), required=False, nullable=True,
               doc="every inter-token latency in order, client side (vllm bench serving's itls): where the "
                   "request's tokens fell, so calibration can see the steps other requests joined"),
    ),
    sorted_by="arrival_s",
    doc="one row per request",
)

STEPS = TableSchema(
    "steps",
    (
        Column("instance_id", STR),
        Column("step", I64, nonneg=True),
        Column("start_s", F64, nonneg=True),
        Column("end_s", F64, nonneg=True),
        Column("num_seqs", I64, nonneg=True),
        Column("prefill_tokens", I64, nonneg=True, doc="P = sum p_q"),
        Column("decode_tokens", I64, nonneg=True, doc="D = sum d_q"),
        Column("sum_ctx", I64, nonneg=True, doc="sum c_q"),
        Column("sum_ctx_sq", I64, nonneg=True, doc="sum c_q^2"),
        Column("sum_prefill_sq", I64, nonneg=True, doc="sum p_q^2"),
        Column("sum_decode_ctx", I64, nonneg=True, doc="sum c_q*d_q"),
        Column("sum_prefill_attn", I64, nonneg=True, doc="sum p_q*c_q + p_q*(p_q+1)/2"),
        Column("num_preempted", I64, nonneg=True, doc="requests preempted while scheduling this step"),
    ),
    doc="one row per engine step (batch)",
)

STEP_ITEMS = TableSchema(
    "step_items",
    (
        Column("instance_id", STR),
        Column("step", I64, nonneg=True),
        Column("request_id", I64, nonneg=True),
        Column("tokens", I64, nonneg=True, maximum=MAX_TOKENS, doc="tokens scheduled for it this step"),
        Column("computed_before", I64, nonneg=True, maximum=MAX_TOKENS, doc="tokens in its KV cache before the step"),
        Column("prompt_tokens", I64, nonneg=True, maximum=MAX_TOKENS),
    ),
    doc="one row per request scheduled in a step, in the scheduler's order",
)

PREEMPTIONS = TableSchema(
    "preemptions",
    (
        Column("instance_id", STR),
        Column("step", I64, nonneg=True),
        Column("request_id", I64, nonneg=True),
    ),
    doc="requests preempted (recompute) while a step was scheduled",
)

def _instance_columns() -> tuple[Column, ...]:
    """One column per field of the engine's ``InstanceConfig`` (its one
    definition of an instance), so a new engine setting is a new column."""
    from estimators.engine.config import instance_fields

    kinds = {"int": I64, "float": F64, "str": STR, "bool": BOOL}
    return tuple(Column(name, kinds[kind], required=m["required"], nullable=m["nullable"],
                        nonneg=m["nonneg"] and kind in ("int", "float"), doc=m["doc"],
                        maximum=MAX_ENGINE if kind == "int" else None, positive=m.get("positive", False),
                        choices=m.get("choices"), unique=name == "instance_id")
                 for name, kind, m in instance_fields())


INSTANCES = TableSchema("instances", _instance_columns(), doc="one row per serving instance")

QUALITY = TableSchema(
    "quality",
    (
        Column("request_id", I64, nonneg=True),
        Column("model", STR),
        Column("acc", F64, nonneg=True, doc="realised accuracy"),
        Column("acc_hat", F64, nonneg=True, doc="predicted accuracy"),
    ),
    doc="per (request, model) accuracy, realised and predicted",
)

TABLES: dict[str, TableSchema] = {
    t.name: t for t in (REQUESTS, STEPS, STEP_ITEMS, PREEMPTIONS, INSTANCES, QUALITY)
}


def _is_numeric(col: Column) -> bool:
    return pa.types.is_integer(col.type) or pa.types.is_floating(col.type)


def column_max(col: Column) -> float:
    """The largest value a numeric column accepts (traces.limits): its own
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
    numeric_cols: list[tuple[Column, np.ndarray]] = []
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
        numeric_cols.append((col, values))
    if schema.sorted_by in df.columns and len(df):
        # before the sign check: an out-of-order time is better reported as
        # such than as a negative offset from the first row
        v = dict((c.name, vals) for c, vals in numeric_cols)[schema.sorted_by]
        if prev_sorted is not None and v[0] < prev_sorted:
            raise BadInput(file, row_of(0), schema.sorted_by, "not sorted (smaller than the previous row)")
        bad = first_true(np.diff(v) < 0)
        if bad is not None:
            raise BadInput(file, row_of(bad + 1), schema.sorted_by, "not sorted (smaller than the previous row)")
    for col, values in numeric_cols:
        if col.nonneg or col.positive:
            bad = first_true(values <= 0 if col.positive else values < 0)
            if bad is not None:
                sign = "must be positive, got" if col.positive else "negative value"
                raise BadInput(file, row_of(bad), col.name, f"{sign} {_cell(df[col.name], bad)}")
        limit = column_max(col)
        bad = first_true(values > limit)
        if bad is not None:
            raise BadInput(file, row_of(bad), col.name,
                           f"value {_cell(df[col.name], bad)} above the maximum {limit:g} (traces.limits)")
        if col.unique:
            _check_unique(df[col.name], col, file, row_of)
    if schema.name == "steps":
        check_steps(df, file, row_of)


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
