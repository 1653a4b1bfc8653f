"""Per-request LMBench results of llm-d-benchmark (``per_request.csv``):
run_id, prompt_tokens, generation_tokens, ttft_s, generation_time_s,
user_id, question_id, launch_rel_s, launch_time_epoch, finish_time_epoch.

One trace per run (``--run``). Rows are logged as requests complete, so
launch times can be out of order within a run: they are sorted by launch
time (and the importer says so). A ``runs.csv`` beside the file, when
present, supplies the run's model, GPU and target rate for meta.json.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.errors import BadInput
from traces.importers.common import ImportOptions, RequestSink, csv_chunks, numeric
from traces.store import TraceWriter

COLUMNS = ["run_id", "prompt_tokens", "generation_tokens", "ttft_s", "generation_time_s", "launch_rel_s"]


def _run_info(src: Path, run: str) -> dict:
    runs = src.with_name("runs.csv")
    if not runs.is_file():
        return {}
    try:
        table = pd.read_csv(runs, dtype=str)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        return {}
    row = table[table.get("run_id", pd.Series(dtype=str)) == run]
    return {} if row.empty else {k: v for k, v in row.iloc[0].to_dict().items() if isinstance(v, str)}


def import_lmbench(src: Path, writer: TraceWriter, opts: ImportOptions) -> list[str]:
    if not opts.run:
        raise BadInput(src, None, "run_id", "choose a run with --run (one trace per run)")
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
        shown = ", ".join(known[:5]) + (" ..." if len(known) > 5 else "")
        raise BadInput(src, None, "run_id", f"no rows for run {opts.run!r} (runs include {shown})")
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
    order = np.argsort(arrival, kind="stable")
    notes = []
    if (order != np.arange(len(df))).any():
        notes.append(f"run {opts.run}: rows are logged in completion order; sorted {len(df)} requests by launch time")
    df = df.iloc[order].reset_index(drop=True)
    with writer.table("requests") as tw:
        RequestSink(tw, src, {"arrival_s": "launch_rel_s"}).write(df, lines[order])
    writer.meta["source"] = {"kind": "lmbench", "file": str(src), "run": opts.run, **_run_info(src, opts.run)}
    writer.meta["arrivals"] = "measured"
    return notes
