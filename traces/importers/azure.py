"""Azure LLM inference traces (2023 and 2024 releases): CSV with columns
TIMESTAMP (wall clock; 2024 files carry a UTC offset), ContextTokens and
GeneratedTokens. Arrival times become seconds since the first request."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.errors import BadInput
from traces.importers.common import ImportOptions, RequestSink, csv_chunks, numeric
from traces.store import TraceWriter

COLUMNS = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"]


def _task_from_name(path: Path) -> str | None:
    name = path.name.lower()
    for task in ("code", "conv"):
        if f"_{task}" in name:
            return task
    return None


def import_azure(src: Path, writer: TraceWriter, opts: ImportOptions) -> list[str]:
    task = _task_from_name(src)
    t0: pd.Timestamp | None = None
    with writer.table("requests") as tw:
        sink = RequestSink(tw, src, {"arrival_s": "TIMESTAMP"})
        for chunk, lines in csv_chunks(src, COLUMNS, opts.chunk_rows, opts.progress):
            ts = pd.to_datetime(chunk["TIMESTAMP"], format="ISO8601", errors="coerce", utc=True)
            bad = np.flatnonzero(ts.isna().to_numpy())
            if bad.size:
                i = int(bad[0])
                raise BadInput(src, int(lines[i]), "TIMESTAMP", f"not a timestamp: {chunk['TIMESTAMP'].iloc[i]!r}")
            if t0 is None:
                t0 = ts.iloc[0]
            df = pd.DataFrame({
                "arrival_s": (ts - t0).dt.total_seconds().to_numpy(),
                "prompt_tokens": numeric(chunk, "ContextTokens", src, lines),
                "output_tokens": numeric(chunk, "GeneratedTokens", src, lines),
            })
            if task is not None:
                df["task"] = task
            sink.write(df, lines)
    writer.meta["source"] = {"kind": "azure", "file": str(src), "t0": None if t0 is None else t0.isoformat(),
                             "task": task}
    writer.meta["arrivals"] = "measured"
    if t0 is not None:  # arrival_s counts from here: `trace query`'s wall_clock(arrival_s) gives real times
        writer.meta["wall_clock_start"] = t0.tz_convert("UTC").isoformat()
    return []
