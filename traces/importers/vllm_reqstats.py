"""vLLM's per-request stats of a served run (the format of ``shared/data/vllm_gpu_llmservingsim``).

A run is a directory with

- ``requests.jsonl``: ``request_id``, ``input_toks``, ``output_toks``,
  ``arrival_time`` (epoch seconds, the *client's* clock) and ``queued_ts``,
  ``scheduled_ts``, ``first_token_ts``, ``last_token_ts`` (the *engine's*
  monotonic clock: vLLM's RequestStateStats);
- ``timeseries.csv``: once a second, ``t`` (seconds since the run started),
  ``prompt_throughput``, ``gen_throughput`` (tokens/s), ``running``,
  ``waiting``, ``kv_cache_pct``, as vLLM's logger reports them;
- ``meta.json``: vLLM version, engine arguments, and where the run saved
  them the KV cache size and vLLM's whole resolved configuration.

Clock alignment: the engine clock is moved onto the client's by the
smallest offset that puts every request's ``queued_ts`` at or after its
``arrival_time`` (``offset = max(arrival - queued)``): a request cannot be
queued before it was sent, and the tightest request is taken to have
reached the engine at once (every lag is a lower bound). A lag the offset
leaves above ``MAX_ALIGN_LAG_S`` means the clocks cannot be aligned (another
run's file, a clock jump) and the import is refused, naming that request.

The trace: ``requests`` with ``arrival_s`` (client), ``added_s`` (queued,
aligned), ``scheduled_s`` (first scheduled), ``ttft_s`` (first token -
arrival, as the client sees it), ``finish_s`` (last token); ``engine_series`` (the logger's samples, ``t_s``
on the trace's clock); and the engine configuration in ``meta.json``
``engine`` with where each setting came from (``reqstats_engine``).
The trace's clock starts at the run's ``started_at`` (client clock) when
meta.json gives it, else at the first arrival.
"""
from __future__ import annotations

import datetime as _dt
import re
from pathlib import Path

import numpy as np
import pandas as pd

from traces.checks.frame_checks import validate_frame
from traces.datamodel.limits import MAX_EPOCH_S, MAX_ID, shown
from traces.datamodel.schema import ENGINE_SERIES, REQUESTS
from traces.errors import BadInput
from traces.files.jsonio import read_json
from traces.importers.common import ImportOptions, csv_chunks, json_number, jsonl_records, numeric, require_file
from traces.importers.completeness import UNKNOWN, Completeness, counted, enforce, ranges
from traces.importers.engine_settings import check_served, parse_engine_overrides
from traces.importers.reqstats_engine import engine_config, kv_from_usage
from traces.importers.reqstats_kv import held_blocks, peak_blocks
from traces.importers.unmodelled import check_accept_keys
from traces.store import TraceWriter

COUNTS = ("input_toks", "output_toks")
STAMPS = ("arrival_time", "queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
FIELDS = ("request_id", *COUNTS, *STAMPS)
ENGINE_ORDER = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")  # each at or after the one before
SERIES_COLUMNS = ["t", "prompt_throughput", "gen_throughput", "running", "waiting", "kv_cache_pct"]
MAX_ALIGN_LAG_S = 10.0  # the front end hands a request to the engine in ms; 10 s apart are two clocks that disagree
_ID_RE = re.compile(r"^[A-Za-z_-]*(\d+)$")


def import_vllm_reqstats(src: Path, writer: TraceWriter, opts: ImportOptions) -> list[str]:
    if not src.is_dir():
        raise BadInput(src, None, "file", "a vllm-reqstats source is a run directory "
                                          "(requests.jsonl, timeseries.csv, meta.json)")
    overrides = parse_engine_overrides(opts.engine)
    accepted = check_accept_keys(opts.accept_unmodelled)
    meta_path = src / "meta.json"
    require_file(meta_path)
    meta = read_json(meta_path, "file")
    if not isinstance(meta, dict):
        raise BadInput(meta_path, 1, "file", "not a JSON object")
    req_path = src / "requests.jsonl"
    raw, lines = _read_requests(req_path)
    offset, lag = _align(raw, lines, req_path)
    origin, origin_from = _origin(meta, meta_path, float(raw["arrival_time"].min()))
    series = _read_series(src / "timeseries.csv")
    eng = {k: raw[k] + offset - origin for k in ENGINE_ORDER}  # engine stamps on the trace's clock
    prompt, output = raw["input_toks"].to_numpy(np.float64), raw["output_toks"].to_numpy(np.float64)

    def infer_kv(block_size: int) -> tuple[int, str] | None:
        args = (eng["scheduled_ts"].to_numpy(), eng["first_token_ts"].to_numpy(), eng["last_token_ts"].to_numpy(),
                prompt, output, block_size)
        usage = kv_from_usage(series["kv_cache_pct"].tolist(), held_blocks(series["t_s"].to_numpy(), *args).tolist())
        if usage is not None:
            return usage[0], (f"kv_cache_pct of timeseries.csv against the blocks the requests held "
                              f"({usage[1]}, block_size {block_size})")
        kv_notes.append(f"the KV size cannot be inferred: kv_cache_pct of timeseries.csv is "
                        f"{float(series['kv_cache_pct'].max()):g} at most (not reported); the requests held at "
                        f"most {peak_blocks(*args)} blocks at once")
        return None

    kv_notes: list[str] = []
    cfg = engine_config(meta, meta_path, overrides, int((prompt + output).max()), accepted, infer_kv)
    check_served(cfg, int(prompt.max()), int((prompt + output).max()), meta_path)
    done = _completeness(meta, meta_path, raw, lines)
    notes_done = enforce(done, opts.allow_incomplete, meta_path, "num_requests")
    arrival = raw["arrival_time"].to_numpy(np.float64) - origin
    requests = pd.DataFrame({
        "request_id": raw["request_id"].to_numpy(np.int64),
        "arrival_s": arrival,
        "prompt_tokens": raw["input_toks"].to_numpy(np.int64),
        "output_tokens": raw["output_toks"].to_numpy(np.int64),
        "ttft_s": eng["first_token_ts"].to_numpy() - arrival,
        "finish_s": eng["last_token_ts"].to_numpy(),
        "added_s": eng["queued_ts"].to_numpy(),
        "scheduled_s": eng["scheduled_ts"].to_numpy(),
    })
    order = np.argsort(arrival, kind="stable")
    requests = requests.iloc[order].reset_index(drop=True)
    validate_frame(requests, REQUESTS, str(req_path), row_of=lambda i: int(lines[order[i]]))
    with writer.table("requests") as tw:
        tw.write(requests)
    writer.write_table("engine_series", series, source=str(src / "timeseries.csv"))
    align = {"offset_s": float(offset), "how": "engine clock + offset = client clock; offset = max(arrival_time - "
                                              "queued_ts), the smallest that puts every queued_ts at or after its "
                                              "arrival_time", "lag_s": {"median": float(np.median(lag)),
                                                                        "max": float(lag.max())},
             "origin": origin_from}
    writer.meta["source"] = {"kind": "vllm-reqstats", "dir": str(src), "vllm_version": meta.get("vllm_version"),
                             "model": meta.get("model"), "hardware": meta.get("hardware"),
                             "engine_kwargs": meta.get("engine_kwargs"), "clock_alignment": align}
    writer.meta["arrivals"] = "measured"
    writer.meta["engine"] = cfg.to_meta()
    writer.meta["completeness"] = done.to_meta()
    notes = [f"clocks aligned: engine + {offset:.6f} s = client (the smallest offset putting every queued_ts at or "
             f"after its arrival_time); queued lags arrival by {1e3 * float(np.median(lag)):.1f} ms median, "
             f"{1e3 * float(lag.max()):.1f} ms at most; trace clock from {origin_from}"]
    if (order != np.arange(len(order))).any():
        notes.append("requests sorted by arrival_time")
    return notes + notes_done + cfg.lines() + kv_notes


def _completeness(meta: dict, path: Path, raw: pd.DataFrame, lines: np.ndarray) -> Completeness:
    """The run's ``num_requests`` (how many its client sent) against the requests logged; the missing named
    by request number when the ids number them."""
    sent = meta.get("num_requests")
    logged = len(raw)
    if sent is None:
        return Completeness(UNKNOWN, logged, how="meta.json states no num_requests")
    sent = int(json_number(sent, "num_requests", path, None, integer=True))
    ids = raw["request_id"].to_numpy(np.int64)
    gaps = np.setdiff1d(np.arange(sent), ids) if logged < sent and ids.max() < sent else np.zeros(0, np.int64)
    return counted(sent, logged, "meta.json num_requests", f"request ids {ranges(gaps)}" if gaps.size else "")


def _request_id(value, path: Path, line: int) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value).strip() == "":
        raise BadInput(path, line, "request_id", f"must be a string or a whole number, got {shown(value)}")
    return str(value)


def _read_requests(path: Path) -> tuple[pd.DataFrame, np.ndarray]:
    rows, lines, raw_ids = [], [], []
    for line, rec, _ in jsonl_records(path):
        for key in FIELDS:
            if key not in rec:
                raise BadInput(path, line, key, "missing field")
        raw_ids.append(_request_id(rec["request_id"], path, line))
        row = {k: json_number(rec[k], k, path, line, integer=True) for k in COUNTS}
        row.update({k: float(json_number(rec[k], k, path, line, maximum=MAX_EPOCH_S)) for k in STAMPS})
        if row["output_toks"] < 1:
            raise BadInput(path, line, "output_toks", f"{row['output_toks']}: a served request has at least one "
                                                      "output token (its first token is the TTFT's)")
        for before, after in zip(ENGINE_ORDER, ENGINE_ORDER[1:]):
            if row[after] < row[before]:
                raise BadInput(path, line, after, f"{row[after]!r} is before {before} {row[before]!r} "
                                                  "(the engine stamps a request in this order)")
        rows.append(row)
        lines.append(line)
    if not rows:
        raise BadInput(path, 1, "file", "no requests")
    seen: dict[str, int] = {}
    for r, line in zip(raw_ids, lines):
        if r in seen:
            raise BadInput(path, line, "request_id", f"duplicate request id {shown(r)} (first on line {seen[r]})")
        seen[r] = line
    df = pd.DataFrame(rows)
    df.insert(0, "request_id", _ids(raw_ids))
    return df, np.array(lines)


def _ids(raw: list[str]) -> np.ndarray:
    """``bench-17`` -> 17 when every id has a distinct numeric suffix of at most ``MAX_ID``
    (``traces.datamodel.limits``: a 20-digit suffix fits no int64), else the order in the file."""
    nums = [_ID_RE.match(r) for r in raw]
    if all(nums) and all(len(m.group(1)) <= 16 for m in nums):
        ids = [int(m.group(1)) for m in nums]
        if len(set(ids)) == len(ids) and max(ids) <= MAX_ID:
            return np.array(ids, dtype=np.int64)
    return np.arange(len(raw), dtype=np.int64)


def _align(raw: pd.DataFrame, lines: np.ndarray, path: Path) -> tuple[float, np.ndarray]:
    """The engine-to-client offset and each request's lag (queued - arrival, >= 0)."""
    gap = (raw["arrival_time"] - raw["queued_ts"]).to_numpy(np.float64)
    offset = float(gap.max())
    lag = raw["queued_ts"].to_numpy(np.float64) + offset - raw["arrival_time"].to_numpy(np.float64)
    worst = int(np.argmax(lag))
    if lag[worst] > MAX_ALIGN_LAG_S:
        tight = int(np.argmax(gap))
        raise BadInput(path, int(lines[worst]), "queued_ts",
                       f"clocks cannot be aligned: the offset that puts every queued_ts after its arrival_time "
                       f"({offset:.6f} s, set by line {int(lines[tight])}) leaves this request queued "
                       f"{lag[worst]:.3f} s after it arrived (more than {MAX_ALIGN_LAG_S:g} s)")
    return offset, np.maximum(lag, 0.0)


def _origin(meta: dict, path: Path, first_arrival: float) -> tuple[float, str]:
    """The trace's clock origin: ``started_at`` when given (at most a minute before the first arrival)."""
    text = meta.get("started_at")
    if text is None:
        return first_arrival, "the first arrival"
    try:
        t = _dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(path, None, "started_at", f"not an ISO time: {shown(text)}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.UTC)
    start = t.timestamp()
    if not first_arrival - 60.0 <= start <= first_arrival:
        raise BadInput(path, None, "started_at", f"{text} is not within the minute before the first request's "
                                                 f"arrival_time ({first_arrival!r}): not this run's start?")
    return start, "meta.json started_at"


def _read_series(path: Path) -> pd.DataFrame:
    chunk, lines = next(csv_chunks(path, SERIES_COLUMNS, 1 << 30))
    df = pd.DataFrame({
        "t_s": numeric(chunk, "t", path, lines, integer=False),
        "prompt_throughput": numeric(chunk, "prompt_throughput", path, lines, integer=False),
        "gen_throughput": numeric(chunk, "gen_throughput", path, lines, integer=False),
        "running": numeric(chunk, "running", path, lines),
        "waiting": numeric(chunk, "waiting", path, lines),
        "kv_cache_pct": numeric(chunk, "kv_cache_pct", path, lines, integer=False, maximum=100.0),
    })
    names = {"t_s": "t"}
    try:
        validate_frame(df, ENGINE_SERIES, str(path), row_of=lambda i: int(lines[i]))
    except BadInput as e:
        raise BadInput(e.file, e.row, names.get(e.column, e.column), e.reason) from None
    return df
