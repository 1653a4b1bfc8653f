"""The trace data model: tables and column types (the checks every table
must pass before it is written are ``traces.checks.frame_checks``).

One schema serves recorded, imported, generated and simulated traces, so any
consumer can rely on it: times are seconds since the trace start (float64),
token counts are int64, identifiers are int64 (requests) or strings
(instances). Optional columns may be absent from a file; when present they
obey the same checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from traces.datamodel.limits import MAX_ENGINE, MAX_TOKENS

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
    maximum: float | None = None  # None: traces.datamodel.limits' default for the column's kind (frame_checks.column_max)
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
        Column("scheduled_s", F64, required=False, nullable=True, nonneg=True,
               doc="first scheduled by the engine (vLLM's per-request stats: vllm-reqstats imports)"),
        Column("finish_reason", STR, required=False, nullable=True,
               doc="as vLLM names it: stop (its own end) or length (reached max_model_len); twin traces"),
        Column("hash_ids", pa.list_(I64), required=False, nullable=True,
               doc="prefix-chained block ids, one per meta.json hash_block_tokens prompt tokens "
                   "(traces.datamodel.prefix_blocks maps them to engine blocks)"),
        Column("session", I64, required=False, nullable=True, nonneg=True, doc="multi-turn session (generated)"),
        Column("turn", I64, required=False, nullable=True, nonneg=True, doc="turn within its session, from 0"),
        Column("cached_tokens", I64, required=False, nullable=True, nonneg=True, maximum=MAX_TOKENS,
               doc="prefix-cache hit granted at first scheduling (recordings with prefix caching)"),
        Column("utility", F64, required=False, nullable=True, doc="realised utility where served (replays)"),
        Column("on_time", BOOL, required=False, nullable=True, doc="TTFT within the SLO (replays)"),
        Column("cost_micro_usd", F64, required=False, nullable=True, nonneg=True, doc="realised cost (replays)"),
        Column("acc", F64, required=False, nullable=True, nonneg=True, maximum=1.0,
               doc="realised accuracy where served (replays), in [0, 1]"),
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

INSTANCES = TableSchema(
    "instances",
    # one column per field of the engine's InstanceConfig (estimators.engine.config), in its order, with its
    # metadata: the data layer spells them out (it imports no engine); tests/project/test_import_layers.py checks they agree
    (
        Column("instance_id", STR, unique=True),
        Column("model", STR),
        Column("gpus", I64, nonneg=True, doc="accelerators used (0 = CPU)", maximum=MAX_ENGINE),
        Column("policy", STR, doc="vllm-v1 | sarathi | vllm-v0", choices=("vllm-v1", "sarathi", "vllm-v0")),
        Column("max_num_batched_tokens", I64, nonneg=True, maximum=MAX_ENGINE, positive=True),
        Column("max_num_seqs", I64, nonneg=True, maximum=MAX_ENGINE, positive=True),
        Column("block_size", I64, nonneg=True, maximum=MAX_ENGINE, positive=True),
        Column("num_kv_blocks", I64, nonneg=True, maximum=MAX_ENGINE, positive=True),
        Column("price_in", F64, nullable=True, nonneg=True, doc="USD per million prompt tokens"),
        Column("price_out", F64, nullable=True, nonneg=True, doc="USD per million output tokens"),
        Column("profile", STR, nullable=True, doc="batch-time profile name or path"),
        Column("long_prefill_token_threshold", I64, required=False, nullable=True, nonneg=True, doc="0 = off",
               maximum=MAX_ENGINE),
        Column("max_model_len", I64, required=False, nullable=True, nonneg=True,
               doc="requests finish when prompt + output reach it; 0 or empty = 40960", maximum=MAX_ENGINE),
        Column("chunked_prefill", BOOL, required=False, nullable=True),
        Column("watermark", F64, required=False, nullable=True, nonneg=True,
               doc="fraction of KV blocks kept free at admission; empty = the policy's (V1 0, Sarathi and V0 1%)"),
        Column("prefix_caching", BOOL, required=False, nullable=True,
               doc="vLLM's enable_prefix_caching; empty = the policy's (V1 on, as vLLM; Sarathi and V0 off)"),
        Column("device", STR, required=False, nullable=True),
        Column("host_speed", F64, required=False, nullable=True, nonneg=True,
               doc="the twin's true step time / the profile's (1.45 = a host 45% slower than the profile says; "
                   "estimators keep the profile); empty = 1"),
        Column("async_scheduling", BOOL, required=False, nullable=True,
               doc="vLLM's async scheduling (AsyncScheduler, two-deep batch queue; vllm-v1 only); off = the synchronous "
                   "scheduler (vLLM on CPU, and the built-in pools)"),
        Column("vllm_version", STR, required=False, nullable=True,
               doc="the vLLM release whose scheduling rules the kernel follows (0.19.0 to 0.32.x); empty = 0.32.0"),
        Column("scheduling_policy", STR, required=False, nullable=True,
               doc="vLLM's --scheduling-policy: fcfs | priority (a request's priority, lower first, orders waiting and "
                   "picks the preemption victim; vllm-v1 at vLLM 0.32.0 only); empty = fcfs",
               choices=("fcfs", "priority")),
    ),
    doc="one row per serving instance",
)

QUALITY = TableSchema(
    "quality",
    (
        Column("request_id", I64, nonneg=True),
        Column("model", STR),
        Column("acc", F64, nonneg=True, maximum=1.0, doc="realised accuracy, in [0, 1]"),
        Column("acc_hat", F64, nonneg=True, maximum=1.0, doc="predicted accuracy, in [0, 1]"),
    ),
    doc="per (request, model) accuracy, realised and predicted",
)

ENGINE_SERIES = TableSchema(
    "engine_series",
    (
        Column("t_s", F64, nonneg=True, doc="sample time (the logger's, once a second), seconds since trace start"),
        Column("prompt_throughput", F64, nonneg=True, doc="prompt tokens/s over the last interval"),
        Column("gen_throughput", F64, nonneg=True, doc="generated tokens/s over the last interval"),
        Column("running", I64, nonneg=True, doc="requests running"),
        Column("waiting", I64, nonneg=True, doc="requests waiting"),
        Column("kv_cache_pct", F64, nonneg=True, maximum=100.0, doc="KV cache usage, % of blocks"),
    ),
    sorted_by="t_s",
    doc="the engine's own periodic stats (vLLM's logger: vllm-reqstats imports)",
)

DECISIONS = TableSchema(
    "decisions",
    (
        Column("request_id", I64, nonneg=True),
        Column("attempt", I64, nonneg=True, doc="0, or 1 for a retry on another backend (route --retry)"),
        Column("t_s", F64, nonneg=True, doc="decision time, seconds since the proxy started"),
        Column("view", STR, doc="what the router saw: ledger | metrics | exact", choices=("ledger", "metrics", "exact")),
        Column("instance_id", STR),
        Column("alive", BOOL, doc="the backend was taking requests"),
        Column("residents", I64, nonneg=True, doc="requests on the backend in the router's view"),
        Column("view_age_s", F64, nullable=True, nonneg=True,
               doc="how old the engine state in the view was (metrics: since the last poll; ledger: 0)"),
        Column("estimate_s", F64, required=False, nullable=True, nonneg=True,
               doc="the router's estimator's TTFT estimate for the request here (empty: none)"),
        Column("utility_hat", F64, doc="predicted utility of the request here"),
        Column("chosen", BOOL),
        Column("decision_us", F64, nonneg=True, doc="the router's time for this decision (same on every row)"),
    ),
    sorted_by="t_s",
    doc="one row per (routing decision, backend): what a live router (latroute route) saw and chose",
)

TABLES: dict[str, TableSchema] = {
    t.name: t for t in (REQUESTS, STEPS, STEP_ITEMS, PREEMPTIONS, INSTANCES, QUALITY, ENGINE_SERIES, DECISIONS)
}
