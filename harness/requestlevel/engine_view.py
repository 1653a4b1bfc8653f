"""A request-level validation seen from the engine: the per-request stats
vLLM keeps and the series its logger prints (``trace import vllm-reqstats``).

The measured side uses the engine's stamps, as LLMServingSim's summary of
the same runs defines its metrics: TTFT = first token - queued, TPOT =
(last - first) / (output - 1), E2E = last token - queued, queueing delay =
first scheduled - queued. The twin's first and last tokens (as it
reports them to the client, with the fitted front-end time) are measured
from the same queued stamp, so the two sides differ only where the twin's
tokens fall; its queueing delay is its own (first scheduled - handed to
the engine). The series: the requests running and waiting at each logger
sample, the twin's counted from its per-request times (running: first
scheduled to last token; waiting: handed over to first scheduled), against
``engine_series``; the same count from the measured stamps is shown beside
it (how far the stamps themselves are from the logger's).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from harness.twin.simulation import TwinResult

TOLERANCE = 0.03  # the target: within 3% of measured
QUEUED_COLUMNS = ("added_s", "scheduled_s")


def has_engine_stamps(reqs: pd.DataFrame) -> bool:
    return all(c in reqs and reqs[c].notna().all() for c in QUEUED_COLUMNS)


def _first_scheduled(res: TwinResult, n: int) -> np.ndarray:
    """Start of the first step each request was in (NaN if never); request ids are row positions.

    Steps are numbered per instance: with several (virtual engines, replicas) a step number repeats, so a
    step is looked up by its instance and number together."""
    out = np.full(n, np.nan)
    items, steps = res.step_items, res.steps
    if items is None or steps is None or items.empty:
        return out
    first = items.sort_values("step", kind="stable").drop_duplicates("request_id")[["request_id", "instance_id", "step"]]
    at = first.merge(steps[["instance_id", "step", "start_s"]], on=["instance_id", "step"], how="left",
                     validate="many_to_one")
    ids = res.requests["request_id"].to_numpy()
    pos = {int(r): i for i, r in enumerate(ids)}
    for rid, start in zip(at["request_id"].to_numpy(), at["start_s"].to_numpy(dtype=np.float64)):
        if int(rid) in pos:
            out[pos[int(rid)]] = start
    return out - float(res.extra.get("time_shift_s", 0.0))


def _summary(measured: np.ndarray, twin: np.ndarray) -> dict:
    ok = np.isfinite(measured) & np.isfinite(twin)
    m, t = measured[ok], twin[ok]
    out = {"n": int(ok.sum())}
    for name, f in (("mean", np.mean), ("p50", np.median), ("p99", lambda x: np.percentile(x, 99))):
        fm, ft = float(f(m)), float(f(t))
        out[name] = {"measured": fm, "twin": ft, "error": (ft - fm) / fm if fm else None}
    return out


def _counts(t: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    return np.array([int(((start <= x) & (x < end)).sum()) for x in t])


def engine_view(reqs: pd.DataFrame, per: pd.DataFrame, res: TwinResult, series: pd.DataFrame | None) -> dict:
    """The peer's metrics over the scored requests (``per.scored``) and the series' errors over the run."""
    arr = reqs["arrival_s"].to_numpy(np.float64)
    queued = reqs["added_s"].to_numpy(np.float64)
    sched = reqs["scheduled_s"].to_numpy(np.float64)
    first_m = arr + reqs["ttft_s"].to_numpy(np.float64)
    last_m = reqs["finish_s"].to_numpy(np.float64)
    first_t = arr + per["ttft_twin_s"].to_numpy(np.float64)
    last_t = arr + per["e2e_twin_s"].to_numpy(np.float64)
    sched_t = _first_scheduled(res, len(reqs))
    entry_t = res.requests["added_s"].to_numpy(np.float64)
    end_t = res.requests["finish_s"].to_numpy(np.float64)  # the engine's last token (no front end)
    out = reqs["output_tokens"].to_numpy(np.float64)
    s = per["scored"].to_numpy(bool)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot_m = np.where(out > 1, (last_m - first_m) / (out - 1), np.nan)
        tpot_t = np.where(out > 1, (last_t - first_t) / (out - 1), np.nan)
    view = {
        "definitions": "TTFT = first token - queued, TPOT = (last - first)/(output - 1), E2E = last - queued, "
                       "queueing delay = first scheduled - queued (the twin's: first scheduled - handed over)",
        "ttft": _summary((first_m - queued)[s], (first_t - queued)[s]),
        "tpot": _summary(tpot_m[s], tpot_t[s]),
        "e2e": _summary((last_m - queued)[s], (last_t - queued)[s]),
        "queueing": _summary((sched - queued)[s], (sched_t - entry_t)[s]),
    }
    checks = [("ttft", "mean"), ("ttft", "p50"), ("ttft", "p99"), ("tpot", "mean"), ("e2e", "mean")]
    view["within_3pct"] = {f"{k} {q}": bool(abs(view[k][q]["error"]) <= TOLERANCE) for k, q in checks
                           if view[k].get(q) and view[k][q]["error"] is not None}
    if series is not None and len(series):
        t = series["t_s"].to_numpy(np.float64)
        twin = {"running": _counts(t, sched_t, end_t), "waiting": _counts(t, entry_t, sched_t)}
        stamps = {"running": _counts(t, sched, last_m), "waiting": _counts(t, queued, sched)}
        view["series"] = {k: {"samples": int(len(t)), "mean_logged": float(series[k].mean()),
                              "twin_mae": float(np.abs(twin[k] - series[k].to_numpy()).mean()),
                              "stamps_mae": float(np.abs(stamps[k] - series[k].to_numpy()).mean())}
                          for k in ("running", "waiting")}
    return view


def format_engine_view(v: dict) -> list[str]:
    lines = ["engine view (" + v["definitions"] + "):"]
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"), ("queueing", "queue")):
        d = v[key]
        if not d.get("n"):
            continue
        lines.append(f"  {label:<5} " + "  ".join(f"{q} {1e3 * d[q]['measured']:.1f}/{1e3 * d[q]['twin']:.1f} ms "
                                                  f"({100 * d[q]['error']:+.1f}%)" if d[q]["error"] is not None else
                                                  f"{q} {1e3 * d[q]['measured']:.1f}/{1e3 * d[q]['twin']:.1f} ms"
                                                  for q in ("mean", "p50", "p99"))
                     + f"  over {d['n']} requests (measured/twin)")
    ok = v["within_3pct"]
    lines.append(f"  within 3%: {sum(ok.values())} of {len(ok)} (" + ", ".join(
        f"{k} {'yes' if y else 'no'}" for k, y in ok.items()) + ")")
    for k, d in (v.get("series") or {}).items():
        lines.append(f"  {k:<7} series MAE twin {d['twin_mae']:.2f}, the stamps' own {d['stamps_mae']:.2f} "
                     f"(logged mean {d['mean_logged']:.1f}, {d['samples']} samples)")
    return lines
