"""Join a client trace (``latroute loadgen``) with a server-side recording
(``RecordingScheduler``) of the same run.

Why: the engine's TTFT (arrival at the front end's input processing to the
end of the step that computed the last prompt token) and the client's TTFT
(send to first streamed chunk) differ by the API server's work: HTTP,
request parsing, hand-over to the engine core, detokenisation and streaming
back. DESIGN calls this the API overhead; with both sides of one run it is
measured per request instead of assumed.

The join key is the id the client sent (``X-Request-Id``), which the
recorder logs as ``client_id`` (it strips vLLM's ``cmpl-`` prefix, prompt
index and random suffix). Never by order: every client request that
succeeded must find exactly one recorded request with its id, or the join is
refused; a recorded id seen twice is refused too. Failed client requests
join when the engine saw them and are counted either way.

The recording's ``request_id`` in the result is the id ``latroute trace
import vllm-record`` gives the same request (the importer's own mapping of
the recorded ids), so the join lines up with the imported trace.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from traces.errors import BadInput
from traces.importers.vllm_record import _request_ids
from traces.store import Trace

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


def join_client_recording(client: Trace, recording: Path) -> JoinResult:
    """Join on the client id (module doc). Raises BadInput when a successful
    client request has no recorded counterpart or an id is ambiguous."""
    req_csv = Path(recording) / "requests.csv"
    if not req_csv.is_file():
        raise BadInput(req_csv, None, "file", "missing: not a recording directory (run `latroute record finish`?)")
    rec = pd.read_csv(req_csv, dtype={"id": str, "client_id": str}, keep_default_na=False, na_values=[""])
    if "client_id" not in rec.columns:
        raise BadInput(req_csv, None, "client_id", "missing column: not recorded by latroute's RecordingScheduler")
    cols = client.columns("requests")
    if "client_id" not in cols:
        raise BadInput(client.file("requests"), None, "client_id", "missing column: not a `latroute loadgen` trace")
    cl = client.read("requests", [c for c in ("request_id", "client_id", "status", "ttft_s", "e2e_s", "output_tokens")
                                  if c in cols])
    ids = _request_ids(rec["id"].astype(str).str.strip().tolist())
    rec["recording_request_id"] = rec["id"].astype(str).str.strip().map(ids)
    dup = rec["client_id"].duplicated(keep=False) & rec["client_id"].isin(cl["client_id"])
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])  # row i of the file is line i + 2
        raise BadInput(req_csv, i + 2, "client_id", f"{rec['client_id'].iloc[i]!r} recorded twice: the join would be "
                                                    "ambiguous (use a fresh --id-prefix per run)")
    ours = rec[rec["client_id"].isin(cl["client_id"])]
    m = cl.merge(ours, on="client_id", how="left", suffixes=("", "_rec"), validate="one_to_one")
    ok = (m["status"] == "ok").to_numpy() if "status" in m else np.ones(len(m), bool)
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
