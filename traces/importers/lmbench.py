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
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

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
from traces.importers.unmodelled import Found, check_accept_keys
from traces.limits import shown
from traces.store import TraceWriter

COLUMNS = ["run_id", "prompt_tokens", "generation_tokens", "ttft_s", "generation_time_s", "launch_rel_s"]


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
    for chunk, lines in csv_chunks(src, COLUMNS, opts.chunk_rows, opts.progress):
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
    with writer.table("requests") as tw:
        RequestSink(tw, src, {"arrival_s": "launch_rel_s"}).write(df, lines[order])
    writer.meta["source"] = {"kind": "lmbench", "file": str(src), "run": opts.run, **info}
    writer.meta["arrivals"] = "measured"
    writer.meta["engine"] = cfg.to_meta()
    writer.meta["completeness"] = done.to_meta()
    return notes + cfg.lines()
