"""Mooncake (FAST'25) traces: JSON lines with ``timestamp`` (ms since the
trace start), ``input_length``, ``output_length`` and ``hash_ids`` (one hash
per 512-token prefix block; equal ids mean a shareable prefix). The ids are
kept as they are, with ``hash_block_tokens`` = 512 in meta.json;
``traces.datamodel.prefix_blocks`` maps them to an engine's blocks (4 blocks of 128,
32 of 16) when a replay needs them. The last id may cover a partial block:
only its full engine blocks count. The records carry no session or
conversation id, and need none: their ids already name every prefix a
conversation's turns share, so no prefix is derived
(docs/reference/importers.md)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from traces.datamodel.limits import MAX_EPOCH_S
from traces.datamodel.prefix_blocks import MAX_TRACE_ID
from traces.errors import BadInput
from traces.importers.common import ImportOptions, RequestSink, json_number, jsonl_records
from traces.store import TraceWriter

MOONCAKE_BLOCK_TOKENS = 512


def _field(rec: dict, key: str, src: Path, line: int, integer: bool, maximum: float | None = None) -> float:
    if key not in rec:
        raise BadInput(src, line, key, "missing column")
    return json_number(rec[key], key, src, line, integer, maximum)


def _flush(sink: RequestSink, rows: list[tuple], lines: list[int], t0: float) -> None:
    if not rows:
        return
    ts, inp, out, hashes = zip(*rows)
    df = pd.DataFrame({
        "arrival_s": (np.asarray(ts, dtype=np.float64) - t0) / 1000.0,
        "prompt_tokens": np.asarray(inp, dtype=np.int64),
        "output_tokens": np.asarray(out, dtype=np.int64),
        "hash_ids": list(hashes),
    })
    sink.write(df, np.asarray(lines))


def import_mooncake(src: Path, writer: TraceWriter, opts: ImportOptions) -> list[str]:
    t0: float | None = None
    with writer.table("requests") as tw:
        sink = RequestSink(tw, src, {"arrival_s": "timestamp"})
        rows: list[tuple] = []
        lines: list[int] = []
        for lineno, rec, read in jsonl_records(src):
            ts = _field(rec, "timestamp", src, lineno, integer=False, maximum=MAX_EPOCH_S * 1000)  # ms
            inp = _field(rec, "input_length", src, lineno, integer=True)
            out = _field(rec, "output_length", src, lineno, integer=True)
            hashes = rec.get("hash_ids", [])
            if not isinstance(hashes, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in hashes):
                raise BadInput(src, lineno, "hash_ids", "not a list of integers")
            if any(h < 0 or h > MAX_TRACE_ID for h in hashes):
                raise BadInput(src, lineno, "hash_ids", "ids must lie in [0, 2**62)")
            if len(hashes) > -(-int(inp) // MOONCAKE_BLOCK_TOKENS):
                raise BadInput(src, lineno, "hash_ids", f"{len(hashes)} ids, but an input of {int(inp)} tokens has "
                                                        f"{-(-int(inp) // MOONCAKE_BLOCK_TOKENS)} blocks of "
                                                        f"{MOONCAKE_BLOCK_TOKENS}")
            if t0 is None:
                t0 = float(ts)
            rows.append((ts, int(inp), int(out), hashes))
            lines.append(lineno)
            if len(rows) >= opts.chunk_rows:
                _flush(sink, rows, lines, t0)
                rows, lines = [], []
                if opts.progress is not None:
                    opts.progress(read)
        _flush(sink, rows, lines, t0 if t0 is not None else 0.0)
    if sink.rows == 0:
        raise BadInput(src, 1, "file", "no data rows")
    writer.meta["source"] = {"kind": "mooncake", "file": str(src), "t0_ms": t0,
                             "hash_block_tokens": MOONCAKE_BLOCK_TOKENS}
    writer.meta["arrivals"] = "measured"
    writer.meta["hash_block_tokens"] = MOONCAKE_BLOCK_TOKENS
    return []
