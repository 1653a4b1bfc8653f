"""Recordings of the real vLLM engine (the format of ``shared/data/vllm_cpu``).

A recording is a directory with ``engine.json`` (engine configuration),
``requests.csv`` (id, arrival_s, added_s, prompt_tokens, output_tokens,
first_token_s, finish_s, ttft_s) and ``steps.jsonl`` (one object per engine
step: step, start_s, end_s, items = [[request_id, tokens, computed_before,
prompt_tokens], ...] in the scheduler's order, preempted = [request_id, ...]).
Prefix-caching recordings (``"prefix_caching": true`` in engine.json) add
``hash_ids`` (space-separated ids of the prompt's full blocks, one per
engine block) and ``cached_tokens`` (the hit vLLM granted at first
scheduling) to requests.csv; both are kept, with ``hash_block_tokens`` =
the engine's block size in meta.json. A recording without the key was made
with prefix caching off.
``snapshots.jsonl`` is a convenience copy of state that steps and items
already determine, so it is not imported.

The result has requests, steps (with batch aggregates), step_items,
preemptions and a one-row instances table built from engine.json, whose
``vllm_version`` is the release whose scheduling rules the twin replays it
with: the recording's own (``engine.json`` ``vllm_version``) when latroute
checked that release's rules, the nearest checked release otherwise (said
at import, and by ``validate``).
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from traces.checks.consistency import Where, check_recording, check_request_times
from traces.checks.frame_checks import first_true, validate_frame
from traces.datamodel.limits import MAX_ENGINE, MAX_ID, MAX_TOKENS, shown
from traces.datamodel.prefix_blocks import parse_id_list
from traces.datamodel.schema import REQUESTS
from traces.errors import BadInput
from traces.files.jsonio import read_json
from traces.importers.common import (
    ImportOptions,
    csv_chunks,
    csv_header,
    json_number,
    jsonl_records,
    numeric,
    require_file,
)
from traces.importers.record_checks import (
    check_engine_types,
    check_first_tokens,
    check_request_lengths,
    check_token_times,
)
from traces.steplog import StepLog
from traces.store import TraceWriter
from traces.vllm_releases.versions import nearest_in_window, unchecked_version_warning

CACHE_COLUMNS = ["hash_ids", "cached_tokens"]  # prefix-caching recordings only
REQUEST_COLUMNS = ["id", "arrival_s", "added_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s", "ttft_s"]
ENGINE_KEYS = ("budget", "max_seqs", "block_size", "num_kv_blocks", "model")
FINISHED_STATUSES = ("finished_stopped", "finished_length_capped")  # vLLM's RequestStatus, as the recorder writes it
_ID_RE = re.compile(r"^[A-Za-z_-]*(\d+)$")
DEFAULT_MAX_MODEL_LEN = 40960  # InstanceConfig's (the data layer imports no engine: tests/project/test_import_layers.py checks)


def _engine(path: Path) -> dict:
    require_file(path)
    eng = read_json(path, "file")
    if not isinstance(eng, dict):
        raise BadInput(path, 1, "file", "not a JSON object")
    for key in ENGINE_KEYS:
        if key not in eng:
            raise BadInput(path, None, key, "missing key")
    for key in ENGINE_KEYS[:-1]:
        if isinstance(eng[key], bool) or not isinstance(eng[key], int) or not 0 < eng[key] <= MAX_ENGINE:
            raise BadInput(path, None, key, f"must be a whole number in [1, {MAX_ENGINE}], got {shown(eng[key])}")
    for key in ("long_prefill", "max_model_len"):
        v = eng.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_ENGINE):
            raise BadInput(path, None, key, f"must be a whole number in [0, {MAX_ENGINE}], got {shown(v)}")
    if not isinstance(eng["model"], str) or not eng["model"].strip():
        raise BadInput(path, None, "model", f"must be a non-empty string, got {shown(eng['model'])}")
    check_engine_types(eng, path)
    if eng["max_seqs"] > eng["budget"]:
        raise BadInput(path, None, "max_seqs", f"{eng['max_seqs']} is above the budget {eng['budget']} "
                                               "(vLLM requires max_num_seqs <= max_num_batched_tokens)")
    return eng


def instance_row(eng: dict, instance: str) -> dict:
    """The recording's one ``instances`` row (``traces.datamodel.schema.INSTANCES``) from
    its checked engine.json: vLLM V1 with chunked prefill, no prices, the
    defaults of ``estimators.engine.config.InstanceConfig`` where the recording
    does not say (NaN for an empty float cell)."""
    return {"instance_id": instance, "model": instance, "gpus": 0, "policy": "vllm-v1",
            "max_num_batched_tokens": eng["budget"], "max_num_seqs": eng["max_seqs"], "block_size": eng["block_size"],
            "num_kv_blocks": eng["num_kv_blocks"], "price_in": np.nan, "price_out": np.nan, "profile": "",
            "long_prefill_token_threshold": int(eng.get("long_prefill", 0) or 0),
            "max_model_len": int(eng["max_model_len"]) if eng.get("max_model_len") else DEFAULT_MAX_MODEL_LEN,
            "chunked_prefill": True, "watermark": np.nan, "prefix_caching": bool(eng.get("prefix_caching", False)),
            "device": "cpu" if "cpu" in str(eng.get("platform", "")).lower() else None, "host_speed": np.nan,
            "async_scheduling": False,  # vLLM's CPU platform turns async scheduling off
            "vllm_version": recorded_rules(eng), "scheduling_policy": "fcfs"}  # the recorder runs vLLM's default


def recorded_rules(eng: dict) -> str:
    """The release whose scheduling rules replay the recording: its own vLLM version inside the checked
    window, else the nearest checked release (``validate`` warns), the newest one for a recording that
    names no version."""
    version = eng.get("vllm_version")
    return nearest_in_window(version if isinstance(version, str) else None)


def _request_ids(raw: list[str]) -> dict[str, int]:
    """Map recorded ids to integers: ``r17`` -> 17 when every id has such a
    numeric suffix (and they are distinct), else the order of appearance."""
    nums = [_ID_RE.match(r) for r in raw]
    if all(nums):
        ids = [int(m.group(1)) for m in nums]
        if len(set(ids)) == len(ids):
            return dict(zip(raw, ids))
    return {r: i for i, r in enumerate(raw)}


def _time(rec: dict, key: str, path: Path, line: int) -> float:
    return float(json_number(rec.get(key), key, path, line))


def _item(it: object) -> bool:
    """[id, tokens, computed_before, prompt_tokens] with counts exact ints in [0, MAX_TOKENS]."""
    return (isinstance(it, list) and len(it) == 4 and isinstance(it[0], (str, int)) and not isinstance(it[0], bool)
            and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_TOKENS for x in it[1:]))


def _hashable(x: object) -> bool:
    return isinstance(x, (str, int)) and not isinstance(x, bool)


def _read_steps(path: Path, ids: dict[str, int], instance: str) -> tuple[StepLog, list[int], list[int], list[int]]:
    """The recording's steps as a StepLog, and the line of each step, item and preemption."""
    lines: list[int] = []
    item_lines: list[int] = []
    pre_lines: list[int] = []
    steps: list[tuple] = []
    items: list[tuple] = []
    preempted: list[tuple] = []
    prev_step, prev_start, prev_end = -1, -1.0, -1.0
    gap: BadInput | None = None  # the first missing step or token: raised after the order checks of every line
    reach: dict = {}  # request -> tokens computed after its last step (computed_before + tokens)
    preempted_since: dict = {}  # request -> preempted since its last step (it restarts from its cache hit)
    for line, rec, _ in jsonl_records(path):
        step = rec.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_ID:
            raise BadInput(path, line, "step", f"not a step number: {shown(step)}")
        if step <= prev_step:
            raise BadInput(path, line, "step", f"not increasing (step {step} after {prev_step})")
        start, end = _time(rec, "start_s", path, line), _time(rec, "end_s", path, line)
        if end < start:
            raise BadInput(path, line, "end_s", f"ends ({end}) before it starts ({start})")
        if start < prev_start:
            raise BadInput(path, line, "start_s", f"step {step} starts ({start}) before step {prev_step} did ({prev_start})")
        if start < prev_end:
            raise BadInput(path, line, "start_s", f"step {step} starts ({start}) before step {prev_step} ended ({prev_end}): "
                                                  "one engine's steps cannot overlap")
        if prev_step >= 0 and step != prev_step + 1 and gap is None:  # reported after the order checks of the
            gap = BadInput(path, line, "step", f"step {step} follows step {prev_step}: the recorder numbers "  # file
                                               "steps one by one, so a step is missing (a line deleted?)")
        prev_step, prev_start, prev_end = step, start, end
        its = rec.get("items")
        if not isinstance(its, list):
            raise BadInput(path, line, "items", "missing or not a list")
        for it in its:
            if not _item(it):
                raise BadInput(path, line, "items", f"item {shown(it)} is not [id, tokens, computed_before, "
                                                    f"prompt_tokens] with counts in [0, {MAX_TOKENS}]")
            if it[0] not in ids:
                raise BadInput(path, line, "items", f"unknown request id {shown(it[0])} (not in requests.csv)")
            done = reach.get(it[0])
            if done is not None and it[2] != done and not preempted_since.get(it[0]) and gap is None:
                gap = BadInput(path, line, "items", f"request {shown(it[0])} resumes at token {it[2]} "
                                                    f"(computed_before), but its last step left it at {done}")
            reach[it[0]] = it[2] + it[1]
            preempted_since[it[0]] = False
            items.append((step, ids[it[0]], it[1], it[2], it[3]))
            item_lines.append(line)
        pre = rec.get("preempted", [])
        if not isinstance(pre, list):
            raise BadInput(path, line, "preempted", "not a list")
        for r in pre:
            if not _hashable(r) or r not in ids:
                raise BadInput(path, line, "preempted", f"unknown request id {shown(r)} (not in requests.csv)")
            preempted_since[r] = True
            preempted.append((step, ids[r]))
            pre_lines.append(line)
        steps.append((step, start, end))
        lines.append(line)
    if not steps:
        raise BadInput(path, 1, "file", "no steps")
    if gap is not None:
        raise gap
    st = np.array(steps, dtype=np.float64).reshape(-1, 3)
    it = np.array(items, dtype=np.int64).reshape(-1, 5)
    pr = np.array(preempted, dtype=np.int64).reshape(-1, 2)
    try:
        log = StepLog.from_items(instance, st[:, 0].astype(np.int64), st[:, 1], st[:, 2], it[:, 0], it[:, 1],
                                 it[:, 2], it[:, 3], it[:, 4], pr[:, 0], pr[:, 1])
    except OverflowError as e:
        raise BadInput(path, None, "items", str(e)) from None
    return log, lines, item_lines, pre_lines


def import_vllm_record(src: Path, writer: TraceWriter, opts: ImportOptions) -> list[str]:
    if not src.is_dir():
        raise BadInput(src, None, "file", "a vllm-record source is a recording directory "
                                          "(engine.json, requests.csv, steps.jsonl)")
    eng = _engine(src / "engine.json")
    instance = str(eng["model"])
    req_path = src / "requests.csv"
    header = csv_header(req_path)
    cache_cols = [c for c in CACHE_COLUMNS if c in header]
    status_col = ["status"] if "status" in header else []
    chunks = list(csv_chunks(req_path, REQUEST_COLUMNS + cache_cols + status_col, 1 << 30))
    rows, lines = chunks[0]
    raw_ids = rows["id"].fillna("").astype(str).str.strip().tolist()
    blank = first_true(np.array([r == "" for r in raw_ids]))
    if blank is not None:
        raise BadInput(req_path, int(lines[blank]), "id", "missing value")
    dup = pd.Series(raw_ids).duplicated().to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise BadInput(req_path, int(lines[i]), "id", f"duplicate request id {shown(raw_ids[i])}")
    ids = _request_ids(raw_ids)
    # the recorder writes requests it never saw finish (in flight when the
    # server stopped, aborted) with their status: those may lack a first
    # token, a finish or a cache hit; every other row must have them all
    open_row = _open_rows(rows, status_col)
    arrival = numeric(rows, "arrival_s", req_path, lines, integer=False)
    requests = pd.DataFrame({
        "request_id": np.array([ids[r] for r in raw_ids], dtype=np.int64),
        "arrival_s": arrival,
        "prompt_tokens": numeric(rows, "prompt_tokens", req_path, lines),
        "output_tokens": numeric(rows, "output_tokens", req_path, lines),
        "instance_id": instance,
        "ttft_s": numeric(rows, "ttft_s", req_path, lines, integer=False, allow_missing=open_row),
        "finish_s": numeric(rows, "finish_s", req_path, lines, integer=False, allow_missing=open_row),
        "added_s": numeric(rows, "added_s", req_path, lines, integer=False, allow_missing=open_row),
    })
    first_token = numeric(rows, "first_token_s", req_path, lines, integer=False, allow_missing=open_row)
    if "hash_ids" in cache_cols:
        requests["hash_ids"] = _hash_ids(rows["hash_ids"], req_path, lines)
    if "cached_tokens" in cache_cols:
        requests["cached_tokens"] = numeric(rows, "cached_tokens", req_path, lines, allow_missing=open_row)
    # recorded ids are kept (not renumbered as RequestSink would)
    validate_frame(requests, REQUESTS, str(req_path), row_of=lambda i: int(lines[i]))
    row_of = lambda i: int(lines[i])  # noqa: E731
    check_request_lengths(requests, eng, Where(str(req_path), row_of, "line"))
    steps_path = src / "steps.jsonl"
    log, step_lines, item_lines, pre_lines = _read_steps(steps_path, ids, instance)
    _check_complete(log, requests, first_token, lines, req_path, steps_path, step_lines)
    table = pd.DataFrame([instance_row(eng, instance)])
    table["profile"] = None  # a recording names no profile
    sp = str(steps_path)
    check_recording(requests, log.steps, log.step_items, log.preemptions, table, {
        "requests": Where(str(req_path), row_of, "line"),
        "steps": Where(sp, lambda i: step_lines[i], "line"),
        "step_items": Where(sp, lambda i: item_lines[i], "line"),
        "preemptions": Where(sp, lambda i: pre_lines[i], "line"),
        "instances": Where(str(src / "engine.json"), lambda i: None)})
    check_request_times(requests, Where(str(req_path), row_of, "line"))
    check_first_tokens(requests, first_token, Where(str(req_path), row_of, "line"))
    check_token_times(requests, first_token, log, Where(str(req_path), row_of, "line"), steps_path.name)
    with writer.table("requests") as tw:
        tw.write(requests)
    log.write(writer, source=sp)
    writer.write_table("instances", table, source=str(src / "engine.json"))
    writer.meta["source"] = {"kind": "vllm-record", "dir": str(src), "vllm_version": eng.get("vllm_version"),
                             "platform": eng.get("platform"), "async_scheduling": eng.get("async_scheduling"),
                             "engine": {k: v for k, v in eng.items() if k != "model_config"}}
    writer.meta["arrivals"] = "measured"
    if "hash_ids" in cache_cols:
        writer.meta["hash_block_tokens"] = int(eng["block_size"])
    warning = unchecked_version_warning(writer.meta)
    return [] if warning is None else [warning.removeprefix("warning: ")]


def _open_rows(rows: pd.DataFrame, status_col: list[str]) -> np.ndarray:
    """Rows the recorder marked as not finished normally (``unfinished``:
    in flight at shutdown; aborted, ignored or error): only these may lack
    a first token or a finish. Without a status column, none."""
    if not status_col:
        return np.zeros(len(rows), dtype=bool)
    status = rows["status"].fillna("").astype(str).str.strip().str.lower()
    return ~status.isin(FINISHED_STATUSES).to_numpy()


def _check_complete(log: StepLog, requests: pd.DataFrame, first_token: np.ndarray, lines: np.ndarray,
                    req_path: Path, steps_path: Path, step_lines: list[int]) -> None:
    """A recording is complete when every request with a first token was
    scheduled in some step and no first token comes after the last step
    ended: a ``steps.jsonl`` cut at a line boundary reads as valid JSON
    lines, so only this check tells it from a whole recording. The first
    offending request is named (its requests.csv row), with the last step
    read."""
    scheduled = set(log.step_items["request_id"].tolist())
    rid = requests["request_id"].to_numpy()
    need = np.isfinite(first_token)
    missing = np.array([need[i] and rid[i] not in scheduled for i in range(len(rid))], dtype=bool)
    bad = first_true(missing)
    if bad is not None:
        last = int(log.steps["step"].iloc[-1])
        raise BadInput(req_path, int(lines[bad]), "id",
                       f"request {rid[bad]} has a first token but is in no step of {steps_path.name} "
                       f"({int(missing.sum())} such requests; the steps end at step {last}, line {step_lines[-1]}: "
                       "an incomplete recording?)")
    last_end = float(log.steps["end_s"].iloc[-1])
    late = need & (first_token > last_end + 1e-6)
    bad = first_true(late)
    if bad is not None:
        raise BadInput(req_path, int(lines[bad]), "first_token_s",
                       f"first token at {first_token[bad]!r} s, after the last step of {steps_path.name} ended "
                       f"({last_end!r} s, line {step_lines[-1]}): an incomplete recording?")


def _hash_ids(cells: pd.Series, path: Path, lines: np.ndarray) -> list:
    out = []
    for i, cell in enumerate(cells.tolist()):
        try:
            out.append(parse_id_list("" if pd.isna(cell) else cell))  # a prompt under one block has none
        except ValueError as e:
            raise BadInput(path, int(lines[i]), "hash_ids", str(e)) from None
    return out

