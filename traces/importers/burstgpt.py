"""BurstGPT traces (Azure OpenAI GPT-3.5/GPT-4 service logs): CSV with
Timestamp (seconds), Model, Request tokens, Response tokens, Total tokens and
Log Type.

The BurstGPT release documents rows with ``Response tokens`` = 0 as failed
requests (its ``*_without_fails`` files are the same logs without them), so
they are dropped unless ``--keep-failed`` is given; the count is reported.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.datamodel.limits import MAX_EPOCH_S
from traces.errors import BadInput
from traces.importers.common import ImportOptions, RequestSink, csv_chunks, numeric
from traces.store import TraceWriter

COLUMNS = ["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"]


def import_burstgpt(src: Path, writer: TraceWriter, opts: ImportOptions) -> list[str]:
    t0: float | None = None
    failed = filtered = 0
    models: set[str] = set()
    with writer.table("requests") as tw:
        sink = RequestSink(tw, src, {"arrival_s": "Timestamp", "prompt_tokens": "Request tokens",
                                     "output_tokens": "Response tokens"})
        for chunk, lines in csv_chunks(src, COLUMNS, opts.chunk_rows, opts.progress):
            ts = numeric(chunk, "Timestamp", src, lines, integer=False, maximum=MAX_EPOCH_S)
            prompt = numeric(chunk, "Request tokens", src, lines)
            output = numeric(chunk, "Response tokens", src, lines)
            model = chunk["Model"].fillna("").astype(str).str.strip().to_numpy()
            models.update(np.unique(model).tolist())
            keep = np.ones(len(chunk), dtype=bool)
            if opts.model is not None:
                keep &= np.char.lower(model.astype(str)) == opts.model.lower()
                filtered += int((~keep).sum())
            if not opts.keep_failed:
                fail = keep & (output == 0)
                failed += int(fail.sum())
                keep &= ~fail
            if not keep.any():
                continue
            if t0 is None:
                t0 = float(ts[keep][0])
            df = pd.DataFrame({
                "arrival_s": ts[keep] - t0,
                "prompt_tokens": prompt[keep],
                "output_tokens": output[keep],
                "task": chunk["Log Type"].to_numpy()[keep],
            })
            sink.write(df, lines[keep])
    if sink.rows == 0:  # a trace of no requests is one every reader refuses: refused here, naming the source
        why = (f"no rows of model {opts.model!r} (models in file: {', '.join(sorted(models))})"
               if opts.model is not None and filtered else
               f"no usable rows ({failed} failed requests with Response tokens = 0; --keep-failed keeps them)"
               if failed else "no data rows")
        raise BadInput(src, None, "file", why)
    notes = []
    if failed:
        notes.append(f"dropped {failed} failed requests (Response tokens = 0; --keep-failed keeps them)")
    if opts.model is not None:
        notes.append(f"kept model {opts.model!r}: dropped {filtered} rows of other models")
        if sink.rows == 0:
            notes.append(f"no rows of model {opts.model!r} (models in file: {', '.join(sorted(models))})")
    writer.meta["source"] = {"kind": "burstgpt", "file": str(src), "t0": t0, "model": opts.model,
                             "dropped_failed": failed, "dropped_other_models": filtered}
    writer.meta["arrivals"] = "measured"
    return notes
