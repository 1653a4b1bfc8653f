"""Per-request LMBench results of llm-d-benchmark (``per_request.csv``):
run_id, prompt_tokens, generation_tokens, ttft_s, generation_time_s,
user_id, question_id, launch_rel_s, launch_time_epoch, finish_time_epoch.

One trace per run (``--run``). Rows are logged as requests complete, so
launch times can be out of order within a run: they are sorted by launch
time (and the importer says so). A ``runs.csv`` beside the file, when
present, supplies the run's model, GPU, stack, workload and target rate:
the GPU (and its tensor-parallel size, where the label says it) goes into
the engine settings (``traces.importers.engine_settings``), a stack with
LMCache is refused unless accepted (``traces.importers.unmodelled``), and
the workload and rate say how many requests the run sent
(``traces.importers.completeness``): a run that logged fewer is refused
unless ``--allow-incomplete``.

Sessions: LMBench's multi-round QA logs each request's ``user_id`` and
``question_id`` (the ``short_input`` and ``long_input`` runs; blank in the
older ones). They become the trace's ``session`` and ``turn`` (turn =
question_id - 1: LMBench numbers questions from 1), checked
(``traces.importers.session_prefix.check_turns``: a session id on some rows only, a
turn without a session, a turn twice or out of order is refused with its
row). Each turn's prompt carries the conversation so far, so prompt
``hash_ids`` are derived from the session structure
(``traces.importers.session_prefix``, 16-token blocks, ``hash_block_tokens`` in
meta.json) unless ``--no-session-prefix``; a run whose turns do not carry
the conversation (a prompt shorter than the previous turn's prompt +
output) gets none, and the import says which row showed it.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from traces.datamodel.limits import shown
from traces.datamodel.prefix_blocks import ideal_hit_tokens
from traces.errors import BadInput
from traces.importers.common import (
    DEFAULT_CHUNK_ROWS,
    ImportOptions,
    RequestSink,
    csv_chunks,
    csv_header,
    numeric,
    refuse_duplicate_columns,
    require_columns,
)
from traces.importers.completeness import Completeness, enforce, lmbench
from traces.importers.engine_settings import GIVEN, INFERRED, Stated, assemble, parse_engine_overrides, run_day
from traces.importers.session_prefix import (
    ASSUMPTION,
    SESSION_BLOCK_TOKENS,
    SessionColumns,
    check_turns,
    conversation_gap,
    derive_hash_ids,
)
from traces.importers.unmodelled import Found, check_accept_keys
from traces.store import TraceWriter

COLUMNS = ["run_id", "prompt_tokens", "generation_tokens", "ttft_s", "generation_time_s", "launch_rel_s"]
SESSION_COLUMNS = ["user_id", "question_id"]  # optional: blank (or absent) in the older runs


def _run_info(src: Path, run: str) -> dict:
    """The run's row of ``runs.csv`` beside the file (strings only), {} when
    there is no such file. A runs.csv that is there but unreadable, has no
    ``run_id`` column or names the run twice is refused with its row: its
    model and GPU go into meta.json, and a wrong one there is silent."""
    runs = src.with_name("runs.csv")
    if not runs.exists():
        return {}
    header = csv_header(runs)
    refuse_duplicate_columns(runs, header)
    require_columns(runs, header, ["run_id"])
    parts = [chunk for chunk, _ in csv_chunks(runs, header, DEFAULT_CHUNK_ROWS)]
    table = pd.concat(parts, ignore_index=True)
    ids = table["run_id"].fillna("").astype(str).str.strip()
    hits = np.flatnonzero((ids == run).to_numpy())
    if hits.size > 1:
        raise BadInput(runs, int(hits[1]) + 2, "run_id", f"run {run!r} appears twice")
    if not hits.size:
        return {}
    return {k: v for k, v in table.iloc[int(hits[0])].to_dict().items() if isinstance(v, str)}


def _run_engine(info: dict, runs: Path) -> tuple[dict[str, Stated], list[Found]]:
    """What runs.csv says of the engine: the GPU from its ``gpu`` label ("unrecorded" says nothing), the
    tensor-parallel size where the label says "(TP4)" (given) or "x2" GPUs per replica (inferred), and LMCache
    where the stack names it."""
    stated: dict[str, Stated] = {}
    label = str(info.get("gpu") or "").strip()
    if label and not label.lower().startswith("unrecorded"):
        name = re.split(r"\s*[\[(;]|\s+x\s*\d", label)[0].strip()
        stated["gpu"] = Stated(name, GIVEN, f"{runs.name} gpu {shown(label, 80)}")
        tp = re.search(r"\(TP\s*(\d+)\)", label)
        per_replica = re.search(r"\sx\s*(\d+)\b", label)
        if tp:
            stated["tensor_parallel_size"] = Stated(int(tp.group(1)), GIVEN, f"{runs.name} gpu label (TP{tp.group(1)})")
        elif per_replica:
            stated["tensor_parallel_size"] = Stated(
                int(per_replica.group(1)), INFERRED,
                f"{runs.name} gpu label 'x{per_replica.group(1)}': that many GPUs per replica, taken as tensor parallel")
    found = []
    for col in ("stack", "stack_description"):
        if "lmcache" in str(info.get(col) or "").lower():
            found.append(Found("lmcache", col, info[col]))
            break
    return stated, found


def _run_date(info: dict) -> str | None:
    """The run's day from runs.csv ``t0_launch_epoch`` (its first launch), when it has one."""
    try:
        return run_day(float(info.get("t0_launch_epoch") or "nan"))
    except ValueError:
        return None


def _target_qps(info: dict, runs: Path) -> float | None:
    raw = info.get("target_qps")
    if raw is None or not str(raw).strip():
        return None
    try:
        qps = float(raw)
    except ValueError:
        raise BadInput(runs, None, "target_qps", f"not a number: {shown(raw)}") from None
    if not 0 < qps < 1e6:
        raise BadInput(runs, None, "target_qps", f"must be a rate in (0, 1e6) requests/s, got {shown(raw)}")
    return qps


def import_lmbench(src: Path, writer: TraceWriter, opts: ImportOptions) -> list[str]:
    if not opts.run:
        raise BadInput(src, None, "run_id", "choose a run with --run (one trace per run)")
    overrides = parse_engine_overrides(opts.engine)
    accepted = check_accept_keys(opts.accept_unmodelled)
    parts: list[pd.DataFrame] = []
    line_parts: list[np.ndarray] = []
    seen: set[str] = set()
    header = csv_header(src)
    columns = COLUMNS + [c for c in SESSION_COLUMNS if c in header]
    for chunk, lines in csv_chunks(src, columns, opts.chunk_rows, opts.progress):
        ids = chunk["run_id"].fillna("").astype(str).str.strip()
        if len(seen) < 2000:
            seen.update(ids.unique().tolist())
        mask = (ids == opts.run).to_numpy()
        if mask.any():
            parts.append(chunk[mask])
            line_parts.append(lines[mask])
    if not parts:
        known = sorted(seen)
        listed = ", ".join(known[:5]) + (" ..." if len(known) > 5 else "")
        raise BadInput(src, None, "run_id", f"no rows for run {opts.run!r} (runs include {listed})")
    rows = pd.concat(parts, ignore_index=True)
    lines = np.concatenate(line_parts)
    launch = numeric(rows, "launch_rel_s", src, lines, integer=False)
    ttft = numeric(rows, "ttft_s", src, lines, integer=False)
    gen = numeric(rows, "generation_time_s", src, lines, integer=False)
    arrival = launch - launch.min()
    df = pd.DataFrame({
        "arrival_s": arrival,
        "prompt_tokens": numeric(rows, "prompt_tokens", src, lines),
        "output_tokens": numeric(rows, "generation_tokens", src, lines),
        "ttft_s": ttft,
        "finish_s": arrival + ttft + gen,
    })
    runs = src.with_name("runs.csv")
    info = _run_info(src, opts.run)
    stated, found = _run_engine(info, runs)
    cfg = assemble(stated, overrides, int((df["prompt_tokens"] + df["output_tokens"]).max()),
                   runs if runs.exists() else src, found, accepted, run_date=_run_date(info))
    done: Completeness = lmbench(launch, _target_qps(info, runs), info.get("workload"))
    notes = enforce(done, opts.allow_incomplete, src, "launch_rel_s")
    order = np.argsort(arrival, kind="stable")
    if (order != np.arange(len(df))).any():
        notes.append(f"run {opts.run}: rows are logged in completion order; sorted {len(df)} requests by launch time")
    df = df.iloc[order].reset_index(drop=True)
    session_meta, session_notes = _sessions(rows.iloc[order], lines[order], df, src, opts)
    with writer.table("requests") as tw:
        RequestSink(tw, src, {"arrival_s": "launch_rel_s"}).write(df, lines[order])
    writer.meta["source"] = {"kind": "lmbench", "file": str(src), "run": opts.run, **info}
    writer.meta["arrivals"] = "measured"
    writer.meta["engine"] = cfg.to_meta()
    writer.meta["completeness"] = done.to_meta()
    if session_meta:
        writer.meta["sessions"] = session_meta
        if "hash_ids" in df:
            writer.meta["hash_block_tokens"] = SESSION_BLOCK_TOKENS
    return notes + session_notes + cfg.lines()


def _whole_or_empty(rows: pd.DataFrame, col: str, src: Path, lines: np.ndarray) -> np.ndarray:
    """A column of whole numbers with empty cells (NaN), refusing anything else by row."""
    v = numeric(rows, col, src, lines, integer=False, maximum=float(2**53),  # ids, exact as floats up to 2**53
                allow_missing=np.ones(len(rows), dtype=bool))
    bad = np.flatnonzero(np.isfinite(v) & (v != np.floor(v)))
    if bad.size:
        raise BadInput(src, int(lines[bad[0]]), col, f"not a whole number: {shown(rows[col].iloc[bad[0]])}")
    return v


def _sessions(rows: pd.DataFrame, lines: np.ndarray, df: pd.DataFrame, src: Path,
              opts: ImportOptions) -> tuple[dict, list[str]]:
    """Add ``session``, ``turn`` and (unless ``opts.session_prefix`` is off or the turns do not carry the
    conversation) derived ``hash_ids`` to ``df`` (rows in launch order); the meta.json entry and the notes."""
    if not all(c in rows for c in SESSION_COLUMNS):
        return {}, []
    user, question = (_whole_or_empty(rows, c, src, lines) for c in SESSION_COLUMNS)
    if not check_turns(user, question, SessionColumns(src, lines, "user_id", "question_id")):
        return {}, []
    first = np.flatnonzero(question < 1)
    if first.size:
        raise BadInput(src, int(lines[first[0]]), "question_id", "LMBench numbers questions from 1, got 0")
    session = user.astype(np.int64)
    df["session"] = session
    df["turn"] = question.astype(np.int64) - 1
    prompt, output = df["prompt_tokens"].to_numpy(np.int64), df["output_tokens"].to_numpy(np.int64)
    meta: dict = {"from": "user_id, question_id", "sessions": int(np.unique(session).size),
                  "turn": "question_id - 1"}
    said = f"{meta['sessions']} sessions (user_id), turns (question_id) up to {int(question.max())}"
    if not opts.session_prefix:
        meta["prefix"] = "not derived (--no-session-prefix)"
        return meta, [f"{said}; prompt prefixes not derived (--no-session-prefix)"]
    gap = conversation_gap(session, prompt, output)
    if gap is not None:
        i, p, before = gap
        meta["prefix"] = (f"not derived: row {int(lines[i])} has a prompt of {p} tokens, shorter than the previous "
                          f"turn's prompt + output ({before}): the turns do not carry the conversation so far")
        return meta, [f"{said}; {meta['prefix']}"]
    hash_ids = derive_hash_ids(session, prompt, output, SESSION_BLOCK_TOKENS)
    df["hash_ids"] = hash_ids
    hit, total = ideal_hit_tokens(hash_ids, prompt.tolist(), SESSION_BLOCK_TOKENS)
    meta.update({"prefix": "derived", "assumption": ASSUMPTION, "block_tokens": SESSION_BLOCK_TOKENS,
                 "shared_prompt_tokens": hit, "prompt_tokens": total})
    return meta, [f"{said}; prompt hash_ids derived from them ({SESSION_BLOCK_TOKENS}-token blocks: {ASSUMPTION}): "
                  f"{hit:,} of {total:,} prompt tokens ({100 * hit / max(total, 1):.0f}%) lie in blocks an earlier prompt "
                  "of their session named (--no-session-prefix to leave them out)"]
