"""``--record DIR``: an emulated run written as the offline twin writes one
(``requests``, ``instances``, ``steps``, ``step_items``, ``preemptions``),
so ``validate`` and ``estimate`` read it like a recording. Request ids are
pool-wide, in arrival order; ``client_id`` is the X-Request-Id. Times are
twin seconds since the server started; ``ttft_s`` includes the pool's
front-end overhead, as the offline twin's does (``finish_s`` too: the
client sees every token after it). Requests a client
abandoned are kept (finish_reason ``abort``, output_tokens what the engine
had produced when it dropped them, a discarded last token included, so
the step log's walk ends them where the engine did).
With prefix caching in the pool, ``requests.hash_ids`` holds each
prompt's block ids and meta.json ``hash_block_tokens`` their block, so the
offline twin replays the served run's cache hits; ``cached_tokens`` is the
hit each request was granted at its first scheduling (as the twin's).
The lag report goes to meta.json (``serve.lag``). A client id is checked
when its request comes in (``harness.serve.protocol.request_id``); text a
trace cannot hold is still escaped here, so no request costs the others
their recording.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from estimators.engine.config import instances_table
from harness.serve.engine import ServedEngine
from traces.steplog import StepLog
from traces.store import TraceWriter


def requests_frame(engines: list[ServedEngine], overhead_s: float, hashed: bool = False) -> pd.DataFrame:
    rows = []
    for e in engines:
        for h in e.requests:
            rows.append({"request_id": h.gid, "arrival_s": h.arrival_t, "prompt_tokens": h.prompt,
                         "output_tokens": max(h.delivered, h.engine_outputs), "instance_id": e.spec.instance_id, "added_s": h.arrival_t,
                         "ttft_s": h.first_t - h.arrival_t + overhead_s if h.delivered else np.nan,
                         "finish_s": h.finish_t + overhead_s if h.finish_reason == "length" else np.nan,
                         "preemptions": h.preemptions, "finish_reason": h.finish_reason,
                         "client_id": h.client_id.encode("utf-8", "backslashreplace").decode("utf-8"),
                         "max_tokens": h.max_tokens,
                         "hash_ids": list(h.hash_ids) if h.hash_ids is not None else [],
                         "cached_tokens": float(h.cached) if np.isfinite(h.scheduled_t) else np.nan})
    cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens", "instance_id", "added_s", "ttft_s", "finish_s",
            "preemptions", "finish_reason", "client_id"] + (["hash_ids", "cached_tokens"] if hashed else [])
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("instance_id", "finish_reason", "client_id", "hash_ids")
                                          else np.float64 if c.endswith("_s") or c == "cached_tokens"
                                          else np.int64) for c in cols})
    df = pd.DataFrame(rows)[cols]
    return df.sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)


def step_log(engines: list[ServedEngine]) -> StepLog | None:
    logs = []
    for e in engines:
        e.inst.flush_log()
        rid_map = np.array([h.gid for h in e.requests] or [0], dtype=np.int64)
        g = e.inst.step_log(rid_map)
        if g is not None:
            logs.append(g)
    return StepLog.concat(logs)


def write_recording(out: Path, engines: list[ServedEngine], overhead_s: float, meta: dict,
                    force: bool = False, hash_block: int | None = None) -> None:
    with TraceWriter(out, force) as w:
        w.meta.update(meta)
        w.meta["arrivals"] = "measured"
        if hash_block:
            w.meta["hash_block_tokens"] = int(hash_block)
        w.write_table("requests", requests_frame(engines, overhead_s, hashed=bool(hash_block)))
        w.write_table("instances", instances_table([e.spec.row_config() for e in engines]))
        log = step_log(engines)
        if log is not None:
            log.write(w)
