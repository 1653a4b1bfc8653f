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
        Column("request_id", I64, nonneg=True, doc="unique id within the trace"),
        Column("arrival_s", F64, nullable=True, nonneg=True,
               doc="arrival time, seconds since trace start; null only when the source has none "
                   "(meta.json arrivals = 'unknown')"),
        Column("prompt_tokens", I64, nonneg=True),
        Column("output_tokens", I64, nonneg=True, doc="true output length"),
        Column("task", STR, required=False, nullable=True),
        Column("slo_ttft_s", F64, required=False, nullable=True, nonneg=True, doc="TTFT SLO tau_i"),
        Column("instance_id", STR, required=False, nullable=True, doc="where it was served"),
        Column("ttft_s", F64, required=False, nullable=True, nonneg=True, doc="measured time to first token"),
        Column("finish_s", F64, required=False, nullable=True, nonneg=True, doc="time the last token was produced"),
        Column("predicted_output_tokens", I64, required=False, nullable=True, nonneg=True),
        Column("added_s", F64, required=False, nullable=True, nonneg=True, doc="handed to the engine (recordings)"),
        Column("preemptions", I64, required=False, nullable=True, nonneg=True),
        Column("finish_reason", STR, required=False, nullable=True,
               doc="as vLLM names it: stop (its own end) or length (reached max_model_len); twin traces"),
        Column("hash_ids", pa.list_(I64), required=False, nullable=True,
               doc="prefix-chained block ids, one per meta.json hash_block_tokens prompt tokens "
                   "(traces.prefix_blocks maps them to engine blocks)"),
        Column("session", I64, required=False, nullable=True, nonneg=True, doc="multi-turn session (generated)"),
        Column("turn", I64, required=False, nullable=True, nonneg=True, doc="turn within its session, from 0"),
        Column("cached_tokens", I64, required=False, nullable=True, nonneg=True,
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
        Column("tokens", I64, nonneg=True, doc="tokens scheduled for it this step"),
        Column("computed_before", I64, nonneg=True, doc="tokens in its KV cache before the step"),
        Column("prompt_tokens", I64, nonneg=True),
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
                        nonneg=m["nonneg"] and kind in ("int", "float"), doc=m["doc"])
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


def first_true(mask: np.ndarray) -> int | None:
    idx = np.flatnonzero(mask)
    return int(idx[0]) if idx.size else None


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
    for name in schema.required:
        if name not in df.columns:
            raise BadInput(file, None, name, "missing column")
    import pandas as pd

    numeric_cols: list[tuple[Column, np.ndarray]] = []
    for col in schema.columns:
        if col.name not in df.columns:
            continue
        if not _is_numeric(col):
            if not col.nullable:
                bad = first_true(df[col.name].isna().to_numpy())
                if bad is not None:
                    raise BadInput(file, row_of(bad), col.name, "missing value")
            continue
        values = pd.to_numeric(df[col.name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
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
        if col.nonneg:
            bad = first_true(values < 0)
            if bad is not None:
                raise BadInput(file, row_of(bad), col.name, f"negative value {values[bad]:g}")

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
