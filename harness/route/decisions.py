"""The decision log: every request the proxy took and every decision it
made, kept in memory and written as a latroute trace (``requests``,
``decisions``, ``instances``, meta.json's ``route``) when the proxy stops.

Rows are appended at the moment they happen -- the decision rows before
the request is forwarded, the request's row when it ends, whatever the
ending (finished, failed, abandoned by the client, refused) -- so a stop
at any point writes everything decided so far; requests still open at the
stop are written with ``status`` "open" and what had streamed back.

The log is written whole whatever the backends and clients sent: a value
a trace cannot hold (a count or time out of the schema's range, text that
is not UTF-8) is replaced when the row is written -- the number by 0 or
empty, the text by its escaped form -- and the row's ``status`` says
``invalid`` with the reason in ``error``; it never stops the write.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

from estimators.engine.config import instances_table
from harness.route.backends import Backend
from traces.datamodel.limits import MAX_ID, MAX_TIME_S, MAX_TOKENS
from traces.store import TraceWriter

COUNTS = ("prompt_tokens", "max_tokens", "predicted_output_tokens", "output_tokens", "attempts")
TIMES = ("arrival_s", "first_s", "finish_s", "slo_ttft_s")
TEXTS = ("client_id", "instance_id", "error")


def _text(v) -> tuple[str, str | None]:
    """``v`` as text a trace holds (valid UTF-8), and why it was not."""
    if v is None:
        return v, None
    s = str(v)
    try:
        s.encode("utf-8")
        return s, None
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8"), "not UTF-8"


def checked(row: RequestRow) -> RequestRow:
    """The row as written: every value within what the trace holds, else
    replaced, the row marked ``invalid`` with the reasons."""
    bad, out = [], {}
    for k in COUNTS:
        v = getattr(row, k)
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= v <= MAX_TOKENS:
            bad.append(f"{k} {str(v)[:40]} out of [0, {MAX_TOKENS}]")
            out[k] = 0
    if not (isinstance(row.request_id, int | np.integer) and 0 <= row.request_id <= MAX_ID):
        bad.append(f"request_id {str(row.request_id)[:40]}")
        out["request_id"] = 0
    for k in TIMES:
        v = getattr(row, k)
        try:
            x = float(v)
        except (TypeError, ValueError, OverflowError):
            x = -1.0
        if not (math.isnan(x) or 0 <= x <= MAX_TIME_S):
            bad.append(f"{k} {str(v)[:40]} out of [0, {MAX_TIME_S:g}]")
            out[k] = math.nan if k != "arrival_s" else 0.0
    for k in TEXTS:
        v, why = _text(getattr(row, k))
        if why:
            bad.append(f"{k} {why}")
            out[k] = v
    if not bad:
        return row
    reason = "invalid: " + "; ".join(bad)
    prior = out.get("error", row.error)
    return replace(row, **out, status="invalid", error=f"{reason} ({prior})" if prior else reason)


@dataclass
class RequestRow:
    request_id: int
    client_id: str
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    slo_ttft_s: float
    predicted_output_tokens: int
    stream: bool
    instance_id: str | None = None
    attempts: int = 0
    first_s: float = math.nan
    finish_s: float = math.nan
    output_tokens: int = 0
    status: str = "open"  # ok | error | abandoned | shed | open (| invalid, in the written log: ``checked``)
    error: str = ""


def _time(v) -> float:
    """A logged duration: finite and >= 0, else NaN (empty)."""
    x = float(v)
    return x if 0 <= x <= MAX_TIME_S else math.nan


@dataclass
class DecisionLog:
    backends: list[Backend]
    view: str
    requests: dict[int, RequestRow] = field(default_factory=dict)
    cols: dict[str, list] = field(default_factory=lambda: {k: [] for k in (
        "request_id", "attempt", "t_s", "view", "instance_id", "alive", "residents", "view_age_s", "estimate_s",
        "utility_hat", "chosen", "decision_us")})
    events: list[dict] = field(default_factory=list)

    def arrived(self, row: RequestRow) -> None:
        self.requests[row.request_id] = row

    def decision(self, i: int, attempt: int, t: float, alive: list[bool], residents: list[int], age: list[float],
                 estimates: np.ndarray | None, utility: np.ndarray, chosen: int, decision_us: float) -> None:
        c = self.cols
        for k, b in enumerate(self.backends):
            c["request_id"].append(i)
            c["attempt"].append(attempt)
            c["t_s"].append(t)
            c["view"].append(self.view)
            c["instance_id"].append(b.instance_id)
            c["alive"].append(alive[k])
            c["residents"].append(min(max(int(residents[k]), 0), MAX_ID))
            c["view_age_s"].append(_time(age[k]))
            c["estimate_s"].append(math.nan if estimates is None else _time(estimates[k]))
            c["utility_hat"].append(float(np.clip(np.nan_to_num(utility[k]), -1e300, 1e300)))
            c["chosen"].append(k == chosen)
            c["decision_us"].append(decision_us)

    def event(self, t: float, kind: str, instance_id: str, reason: str) -> None:
        self.events.append({"t_s": round(t, 6), "event": kind, "instance_id": instance_id, "reason": reason})

    def requests_frame(self) -> pd.DataFrame:
        rows = sorted((checked(r) for r in self.requests.values()), key=lambda r: (r.arrival_s, r.request_id))

        def col(name, dtype=None):
            return np.array([getattr(r, name) for r in rows], dtype=dtype)

        ttft = col("first_s", np.float64) - col("arrival_s", np.float64)
        finish = col("finish_s", np.float64)
        return pd.DataFrame({
            "request_id": col("request_id", np.int64), "arrival_s": col("arrival_s", np.float64),
            "prompt_tokens": col("prompt_tokens", np.int64), "output_tokens": col("output_tokens", np.int64),
            "slo_ttft_s": col("slo_ttft_s", np.float64),
            "instance_id": pd.array([r.instance_id for r in rows], dtype=object),
            "ttft_s": ttft, "finish_s": finish,
            "predicted_output_tokens": col("predicted_output_tokens", np.int64),
            "client_id": pd.array([r.client_id for r in rows], dtype=object),
            "status": pd.array([r.status for r in rows], dtype=object),
            "error": pd.array([r.error for r in rows], dtype=object),
            "e2e_s": finish - col("arrival_s", np.float64),
        })

    def decisions_frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.cols)
        if len(df):
            df = df.sort_values(["t_s", "request_id", "attempt"], kind="stable").reset_index(drop=True)
        return df.astype({"request_id": np.int64, "attempt": np.int64, "t_s": np.float64, "residents": np.int64,
                          "alive": bool, "chosen": bool, "view_age_s": np.float64, "estimate_s": np.float64,
                          "utility_hat": np.float64, "decision_us": np.float64})

    def write(self, out, force: bool, meta: dict) -> dict:
        """The whole log as a trace at ``out``; returns the counts."""
        req = self.requests_frame()
        dec = self.decisions_frame()
        with TraceWriter(out, force) as w:
            w.meta["source"] = {"kind": "route", **meta}
            w.meta["arrivals"] = "measured"
            w.meta["route"] = {"view": self.view, "events": self.events}
            w.write_table("requests", req)
            w.write_table("instances", instances_table([b.spec.row_config() for b in self.backends]))
            w.write_table("decisions", dec)
        counts = req["status"].value_counts().to_dict() if len(req) else {}
        return {"requests": len(req), "decisions": int(dec["attempt"].size // max(len(self.backends), 1)),
                **{str(k): int(v) for k, v in counts.items()}}
