"""Join a client trace (``latroute loadgen``) with a server-side recording
of the same run: a real vLLM's (``RecordingScheduler``: requests.csv) or
an emulated one's (``latroute serve --record``: a latroute trace).

Why: the engine's TTFT (arrival at the front end's input processing to the
end of the step that computed the last prompt token) and the client's TTFT
(send to first streamed chunk) differ by the API server's work: HTTP,
request parsing, hand-over to the engine core, detokenisation and streaming
back. the paper calls this the API overhead; with both sides of one run it is
measured per request instead of assumed.

The join key is the id the client sent (``X-Request-Id``), which the
recorder logs as ``client_id`` (it strips vLLM's ``cmpl-`` prefix, prompt
index and random suffix). Never by order: every client request that
succeeded must find exactly one recorded request with its id, or the join is
refused; a recorded id seen twice is refused too. Failed client requests
join when the engine saw them and are counted either way.

The recording's ``request_id`` in the result is the id ``latroute trace
import vllm-record`` gives the same request (the importer's own mapping of
the recorded ids), so the join lines up with the imported trace; a
``serve --record`` trace's is the trace's own ``request_id``.
"""
from __future__ import annotations

import csv
import hashlib
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from traces.datamodel.limits import MAX_TIME_S, shown
from traces.errors import BadInput
from traces.files.paths import input_dir, input_file, read_text
from traces.importers.vllm_record import _request_ids
from traces.store import Trace, open_trace

JOIN_COLUMNS = ["request_id", "client_id", "recording_request_id", "client_ok", "client_ttft_s", "engine_ttft_s",
                "overhead_s", "client_e2e_s", "engine_e2e_s", "engine_queue_s", "output_tokens"]


@dataclass
class JoinResult:
    per_request: pd.DataFrame
    summary: dict


def _ms(a: np.ndarray, q: float) -> float | None:
    return float(np.quantile(a, q) * 1e3) if a.size else None


def overhead_summary(diff_s: np.ndarray) -> dict:
    """Median, p90, mean (ms) of client TTFT - engine TTFT."""
    d = np.asarray(diff_s, dtype=np.float64)
    d = d[np.isfinite(d)]
    return {"n": int(d.size), "median_ms": _ms(d, 0.5), "p10_ms": _ms(d, 0.1), "p90_ms": _ms(d, 0.9),
            "mean_ms": float(d.mean() * 1e3) if d.size else None}


RECORDING_COLUMNS = ("id", "client_id", "arrival_s", "added_s", "ttft_s", "finish_s")
RECORDING_TRACE_COLUMNS = ("request_id", "client_id", "arrival_s", "added_s", "ttft_s", "finish_s")  # serve --record's
CLIENT_COLUMNS = ("client_id", "ttft_s")
_TIMES = ("arrival_s", "added_s", "ttft_s", "finish_s")  # arrival_s required; the others empty when unfinished


def read_recording_requests(req_csv: Path) -> pd.DataFrame:
    """The recording's requests.csv as strings (and parsed times), every
    cell checked where it enters: UTF-8 (a BOM stripped; another encoding
    refused with its row, traces.files.paths), a header naming each needed column
    once, every row with the header's field count, ids present and distinct,
    times finite, >= 0, <= MAX_TIME_S and in order (added, first token and
    finish not before arrival). Row numbers are CSV lines (header = 1)."""
    text = read_text(req_csv, "file")
    nul = text.find("\0")
    if nul >= 0:  # the csv module reads a NUL as data: a client id with one would join nothing
        raise BadInput(req_csv, text.count("\n", 0, nul) + 1, "row", "holds a NUL byte (not text)")
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    try:
        header = next(reader, None)
    except csv.Error as e:
        raise BadInput(req_csv, 1, "header", f"malformed CSV ({e})") from None
    if not header or not any(c.strip() for c in header):
        raise BadInput(req_csv, 1, "file", "empty file (no header line)")
    header = [c.strip() for c in header]
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise BadInput(req_csv, 1, name, "duplicate column in the header")
        seen.add(name)
    for name in RECORDING_COLUMNS:
        if name not in seen:
            if name == "client_id":
                raise BadInput(req_csv, 1, "client_id", "missing column: not recorded by latroute's RecordingScheduler")
            raise BadInput(req_csv, 1, name, f"missing column (header has: {', '.join(header)})")
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        for row in reader:
            if len(row) != len(header):
                what = "a blank line" if not row else f"{len(row)} fields, the header has {len(header)}"
                raise BadInput(req_csv, reader.line_num, "row", what)
            rows.append(row)
            lines.append(reader.line_num)
    except csv.Error as e:
        raise BadInput(req_csv, reader.line_num + 1, "row", f"malformed CSV ({e})") from None
    if not rows:
        raise BadInput(req_csv, 2, "file", "no data rows (the recording saw no request)")
    rec = pd.DataFrame(rows, columns=header)
    rec["_line"] = lines
    rec["id"] = rec["id"].str.strip()
    empty = np.flatnonzero((rec["id"] == "").to_numpy())
    if empty.size:
        raise BadInput(req_csv, lines[int(empty[0])], "id", "missing value")
    dup = np.flatnonzero(rec["id"].duplicated().to_numpy())
    if dup.size:
        i = int(dup[0])
        raise BadInput(req_csv, lines[i], "id", f"duplicate request id {shown(rec['id'].iloc[i])}")
    rec["client_id"] = rec["client_id"].str.strip().replace("", np.nan)
    for col in _TIMES:
        raw = rec[col].str.strip()
        with np.errstate(over="ignore"):
            v = pd.to_numeric(raw.replace("", np.nan), errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        blank = (raw == "").to_numpy()
        bad = ~blank & ~(np.isfinite(v) & (v >= 0) & (v <= MAX_TIME_S))
        if col == "arrival_s":
            bad |= blank
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            why = "missing value" if blank[i] else f"{shown(raw.iloc[i])} is not a time in [0, {MAX_TIME_S:g}] s"
            raise BadInput(req_csv, lines[i], col, why)
        rec[col] = v
    arrival = rec["arrival_s"].to_numpy()
    for col in ("added_s", "finish_s"):
        before = np.flatnonzero(rec[col].to_numpy() < arrival)
        if before.size:
            i = int(before[0])
            raise BadInput(req_csv, lines[i], col, f"{rec[col].iloc[i]:g} is before the request's arrival "
                                                   f"{arrival[i]:g}")
    late = np.flatnonzero(arrival + rec["ttft_s"].to_numpy() > rec["finish_s"].to_numpy() + 1e-9)
    if late.size:
        i = int(late[0])
        raise BadInput(req_csv, lines[i], "ttft_s", f"first token {rec['ttft_s'].iloc[i]:g} s after arrival "
                                                    f"comes after the finish {rec['finish_s'].iloc[i]:g}")
    return rec


def serve_recording_requests(recording: Path) -> tuple[pd.DataFrame, Path, float]:
    """A ``latroute serve --record`` trace's requests in the form
    ``read_recording_requests`` returns, the file they came from and the
    server's ``--speed`` (its seconds per wall second: its recorded times
    are its own seconds, so the join puts the client's on that clock, the
    one ``validate`` and ``estimate`` predict on). The
    trace already holds the server's request ids (``recording_request_id``
    is its ``request_id``, so the join's identity is the one ``validate``
    computes on the same trace) and the X-Request-Id as ``client_id``; its
    ``ttft_s`` and ``finish_s`` include the pool's front-end overhead, as
    the twin's do, so the join's overhead is what the client saw beyond
    that. Any other latroute trace is refused: it holds no server's view of
    the run."""
    from traces.checks.consistency import Where, check_request_times

    trace = open_trace(recording)
    file = trace.file("requests")
    source = trace.meta.get("source")
    kind = source.get("kind") if isinstance(source, dict) else None
    if kind != "serve":
        raise BadInput(recording / "meta.json", None, "source",
                       f"a latroute trace of kind {shown(kind)}, not a recording: join the recording scheduler's "
                       "directory (requests.csv) or a `latroute serve --record` trace")
    if not trace.has("requests"):
        raise BadInput(file, None, "requests", "table not present in this trace")
    cols = trace.columns("requests")
    for name in RECORDING_TRACE_COLUMNS:
        if name not in cols:
            raise BadInput(file, None, name, "missing column: not written by `latroute serve --record`")
    speed = source.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not 0 < speed <= MAX_TIME_S:
        raise BadInput(recording / "meta.json", None, "source.speed", f"must be a positive number, got {shown(speed)}")
    rec = trace.read("requests", list(RECORDING_TRACE_COLUMNS))
    check_request_times(rec, Where(str(file)))
    early = np.flatnonzero((rec["added_s"] < rec["arrival_s"]).to_numpy())
    if early.size:
        i = int(early[0])
        raise BadInput(file, i + 1, "added_s", f"{rec['added_s'].iloc[i]:g} is before the request's arrival "
                                               f"{rec['arrival_s'].iloc[i]:g}")
    rec["client_id"] = rec["client_id"].map(lambda x: None if x is None or x != x else str(x).strip() or None)
    rec["recording_request_id"] = rec["request_id"].astype(np.int64)
    rec["id"] = rec["recording_request_id"].astype(str)
    rec["_line"] = np.arange(1, len(rec) + 1)  # a Parquet table's rows, counted from 1
    return rec.drop(columns=["request_id"]), file, float(speed)


def recording_identity(request_ids: np.ndarray, arrival_s: np.ndarray) -> dict:
    """What a join records of its recording, so ``validate``/``estimate
    --join`` can tell a join of another recording: the request count and a
    digest of the (request id, arrival in whole microseconds) pairs."""
    ids = np.asarray(request_ids, dtype=np.int64)
    us = np.round(np.asarray(arrival_s, dtype=np.float64) * 1e6).astype(np.int64)
    order = np.argsort(ids, kind="stable")
    h = hashlib.sha256(ids[order].tobytes() + b"|" + us[order].tobytes()).hexdigest()
    return {"requests": int(ids.size), "ids_arrivals_sha256": h}


def _client_requests(client: Trace) -> pd.DataFrame:
    cols = client.columns("requests")
    for name in CLIENT_COLUMNS:
        if name not in cols:
            why = "not a `latroute loadgen` trace" if name == "client_id" else "the client's measured TTFT is needed"
            raise BadInput(client.file("requests"), None, name, f"missing column: {why}")
    cl = client.read("requests", [c for c in ("request_id", "client_id", "status", "ttft_s", "e2e_s", "output_tokens")
                                  if c in cols])
    cl["client_id"] = cl["client_id"].map(lambda x: None if x is None or x != x else str(x).strip())
    dup = np.flatnonzero((cl["client_id"].duplicated() & cl["client_id"].notna()).to_numpy())
    if dup.size:
        i = int(dup[0])
        raise BadInput(client.file("requests"), i + 1, "client_id",
                       f"{shown(cl['client_id'].iloc[i])} sent twice: the join would be ambiguous")
    for col in ("ttft_s", "e2e_s"):
        if col in cl:
            v = pd.to_numeric(cl[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            bad = np.flatnonzero(~np.isnan(v) & ~(np.isfinite(v) & (v >= 0) & (v <= MAX_TIME_S)))
            if bad.size:
                i = int(bad[0])
                raise BadInput(client.file("requests"), i + 1, col, f"{v[i]!r} is not a time in [0, {MAX_TIME_S:g}] s")
            cl[col] = v
    return cl


def join_client_recording(client: Trace, recording: Path) -> JoinResult:
    """Join on the client id (module doc). Raises BadInput when a successful
    client request has no recorded counterpart or an id is ambiguous."""
    input_dir(recording, "RECORDING_DIR")
    req_csv = Path(recording) / "requests.csv"
    speed = 1.0  # server seconds per client (wall) second
    if os.path.lexists(req_csv):
        rec = read_recording_requests(req_csv)
        ids = _request_ids(rec["id"].tolist())
        rec["recording_request_id"] = rec["id"].map(ids)
    elif os.path.lexists(Path(recording) / "meta.json"):
        rec, req_csv, speed = serve_recording_requests(Path(recording))
    else:
        raise BadInput(req_csv, None, "file", "missing: not a recording (the recording scheduler's directory, "
                                              "after `latroute record finish` if its server was killed, or a "
                                              "`latroute serve --record` trace)")
    cl = _client_requests(client)
    for col in ("ttft_s", "e2e_s"):  # the client's wall seconds on the server's clock, where the twin predicts
        if col in cl and speed != 1.0:
            cl[col] = cl[col] * speed
    identity = recording_identity(rec["recording_request_id"].to_numpy(), rec["arrival_s"].to_numpy())
    dup = rec["client_id"].duplicated(keep=False) & rec["client_id"].isin(cl["client_id"]) & rec["client_id"].notna()
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise BadInput(req_csv, int(rec["_line"].iloc[i]), "client_id",
                       f"{rec['client_id'].iloc[i]!r} recorded twice: the join would be "
                       "ambiguous (use a fresh --id-prefix per run)")
    ours = rec[rec["client_id"].isin(cl["client_id"].dropna())]
    ok = (cl["status"] == "ok").to_numpy() if "status" in cl else np.ones(len(cl), bool)  # the client's status
    m = cl.merge(ours.drop(columns=["status"], errors="ignore"), on="client_id", how="left", suffixes=("", "_rec"))
    missing = ok & m["recording_request_id"].isna().to_numpy()
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise BadInput(client.file("requests"), i + 1, "client_id",
                       f"{m['client_id'].iloc[i]!r} ({int(missing.sum())} in all) is not in {req_csv}: "
                       "not the recording of this run")
    engine_ttft = pd.to_numeric(m["ttft_s_rec"], errors="coerce").to_numpy(dtype=np.float64)
    arrival = pd.to_numeric(m["arrival_s"], errors="coerce").to_numpy(dtype=np.float64)
    per = pd.DataFrame({
        "request_id": m["request_id"].to_numpy(),
        "client_id": m["client_id"].to_numpy(),
        "recording_request_id": m["recording_request_id"].astype("Int64"),
        "client_ok": ok,
        "client_ttft_s": m["ttft_s"].to_numpy(dtype=np.float64),
        "engine_ttft_s": engine_ttft,
        "overhead_s": m["ttft_s"].to_numpy(dtype=np.float64) - engine_ttft,
        "client_e2e_s": m["e2e_s"].to_numpy(dtype=np.float64) if "e2e_s" in m else np.nan,
        "engine_e2e_s": pd.to_numeric(m["finish_s"], errors="coerce").to_numpy(dtype=np.float64) - arrival,
        "engine_queue_s": pd.to_numeric(m["added_s"], errors="coerce").to_numpy(dtype=np.float64) - arrival,
        "output_tokens": m["output_tokens"].to_numpy(),
    })
    good = per[per["client_ok"]]
    summary = {
        "client_requests": int(len(per)),
        "joined": int(per["recording_request_id"].notna().sum()),
        "client_failed": int((~per["client_ok"]).sum()),
        "client_failed_seen_by_engine": int(((~per["client_ok"]) & per["recording_request_id"].notna()).sum()),
        "recorded_requests": int(len(rec)),
        "recorded_not_from_client": int(len(rec) - per["recording_request_id"].notna().sum()),
        "ttft_overhead": overhead_summary(good["overhead_s"].to_numpy()),
        "e2e_overhead": overhead_summary((good["client_e2e_s"] - good["engine_e2e_s"]).to_numpy()),
        "client_ttft_median_ms": _ms(good["client_ttft_s"].dropna().to_numpy(), 0.5),
        "engine_ttft_median_ms": _ms(good["engine_ttft_s"].dropna().to_numpy(), 0.5),
    }
    summary["recording"] = identity
    summary["server_speed"] = speed
    return JoinResult(per, summary)


def client_ttft_check(twin_per_request: pd.DataFrame, joined: pd.DataFrame) -> dict:
    """For ``validate --join``: the twin predicts engine TTFT; the client
    sees engine TTFT + API overhead. Reports the measured overhead and the
    twin's error against the client's TTFT with and without adding the
    median measured overhead."""
    c = _client_check(twin_per_request, "ttft_twin_s", joined)
    return {"n": c["n"], "overhead": c["overhead"], "twin_vs_client_mape": c["vs_client_mape"],
            "twin_plus_median_overhead_vs_client_mape": c["plus_median_overhead_vs_client_mape"]}


def client_estimate_check(estimates: pd.DataFrame, joined: pd.DataFrame) -> dict:
    """For ``estimate --join``: per estimator, its error against the TTFT
    the client measured, as is and with the run's median measured API
    overhead added (an estimator predicts the engine's TTFT)."""
    return {str(name): _client_check(g, "est_s", joined) for name, g in estimates.groupby("estimator", sort=False)}


def _client_check(per_request: pd.DataFrame, column: str, joined: pd.DataFrame) -> dict:
    """``column`` (predicted engine TTFT per recording request id) against
    the client's TTFT of the same requests, joined on the recording id."""
    j = joined[joined["client_ok"]].dropna(subset=["recording_request_id"])
    m = per_request.merge(j[["recording_request_id", "client_ttft_s", "overhead_s"]],
                          left_on="request_id", right_on="recording_request_id", how="inner")
    client = m["client_ttft_s"].to_numpy(dtype=np.float64)
    pred = m[column].to_numpy(dtype=np.float64)
    ok = np.isfinite(client) & np.isfinite(pred) & (client > 0)
    med = float(np.nanmedian(m["overhead_s"])) if len(m) else float("nan")

    def mape(x):
        return float(np.mean(np.abs(x[ok] - client[ok]) / client[ok])) if ok.any() else None

    return {"n": int(ok.sum()), "overhead": overhead_summary(m["overhead_s"].to_numpy()),
            "vs_client_mape": mape(pred), "plus_median_overhead_vs_client_mape": mape(pred + med)}


JOIN_NEEDED = ("recording_request_id", "client_ok", "client_ttft_s", "overhead_s")


def read_join(join_dir: Path, trace: Trace, trace_dir: Path) -> pd.DataFrame:
    """A ``trace join`` output for ``validate``/``estimate --join``, checked
    against the trace it is to score: join.parquet readable with the columns
    the comparison needs, and join.json's recording identity (request count,
    ids and arrivals: ``recording_identity``) equal to the trace's, so a join
    of another recording is refused naming the join file instead of being
    scored against requests it never saw."""
    from traces.files.jsonio import parse_json

    d = input_dir(join_dir, "--join")
    pq, js = d / "join.parquet", d / "join.json"
    for f in (pq, js):
        if not os.path.lexists(f):
            raise BadInput(f, None, "--join", "missing: not a `latroute trace join` output")
    input_file(pq, "--join")
    import pyarrow as pa

    try:
        joined = pd.read_parquet(pq)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise BadInput(pq, None, "file", f"not a readable Parquet table ({type(e).__name__})") from None
    for col in JOIN_NEEDED:
        if col not in joined.columns:
            raise BadInput(pq, None, col, "missing column: not a `latroute trace join` output")
    try:
        joined["client_ok"] = joined["client_ok"].astype(bool)
        for col in ("client_ttft_s", "overhead_s"):
            joined[col] = pd.to_numeric(joined[col], errors="raise").astype(np.float64)
        rid = pd.to_numeric(joined["recording_request_id"], errors="raise").astype("Float64")
    except (TypeError, ValueError) as e:
        raise BadInput(pq, None, "column", f"not the types `trace join` writes ({e})") from None
    summary = parse_json(read_text(js, "--join"), js, "join.json")
    ident = summary.get("recording") if isinstance(summary, dict) else None
    if not isinstance(ident, dict) or not isinstance(ident.get("requests"), int) \
            or not isinstance(ident.get("ids_arrivals_sha256"), str):
        raise BadInput(js, None, "recording", "missing the recording's identity (made by an older latroute, or "
                                              "not by `trace join`): run `latroute trace join` again")
    reqs = trace.read("requests", ["request_id", "arrival_s"])
    mine = recording_identity(reqs["request_id"].to_numpy(), reqs["arrival_s"].to_numpy())
    if mine != ident:
        raise BadInput(js, None, "recording", f"a join of another recording than {trace_dir} ({ident['requests']} "
                                              f"recorded requests vs {mine['requests']} in the trace, or other ids "
                                              "or arrivals): join this recording's own client trace")
    known = set(reqs["request_id"].tolist())
    stray = [i for i, v in enumerate(rid) if v is not pd.NA and not pd.isna(v) and int(v) not in known]
    if stray:
        raise BadInput(pq, stray[0] + 1, "recording_request_id", f"{rid[stray[0]]} is not a request of {trace_dir}")
    return joined
