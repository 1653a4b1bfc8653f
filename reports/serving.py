"""The serving metrics users of ``vllm bench serve`` compare: TTFT, TPOT,
ITL and end-to-end latency at chosen percentiles (ms), request and token
throughput, and goodput, with vLLM's definitions:

- TTFT: arrival to first token; E2E: arrival to last token;
- TPOT per request: (E2E - TTFT) / (output tokens - 1), requests with more
  than one output token;
- ITL: every gap between consecutive tokens of a request. It needs token
  times, which only a trace with steps and step items has (a recording, a
  validate run, ``replay --record-steps``); elsewhere ITL is absent, never
  guessed. A token is emitted by a step item that reaches the end of the
  prompt (computed_before + tokens >= prompt tokens), at the step's end;
- throughput: completed requests, output tokens and prompt + output tokens
  per second of the run (first arrival to last finish);
- goodput (``--goodput ttft:MS,tpot:MS,e2el:MS``): completed requests per
  second that met every given bound.

``tidy`` turns the result into long rows (one per metric and statistic)
for the Parquet table written beside every metrics.json.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
GOODPUT_KEYS = ("ttft", "tpot", "e2el")
LATENCIES = ("ttft", "tpot", "itl", "e2el")


def parse_percentiles(text: str | None) -> tuple[float, ...]:
    """``"50,90,99"`` (vLLM's --metric-percentiles) to (50.0, 90.0, 99.0)."""
    if text is None or not str(text).strip():
        return DEFAULT_PERCENTILES
    try:
        vals = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise ValueError(f"not a comma-separated list of percentiles: {text!r}") from None
    bad = [v for v in vals if not 0 < v <= 100]
    if bad or not vals:
        raise ValueError(f"percentiles must be in (0, 100]: {text!r}")
    return vals


def parse_goodput(text: str | None) -> dict[str, float]:
    """``"ttft:200,tpot:50"`` (ms, vLLM's --goodput) to {"ttft": 200.0, ...}."""
    if text is None or not str(text).strip():
        return {}
    out = {}
    for part in str(text).replace(" ", ",").split(","):
        if not part.strip():
            continue
        key, _, val = part.partition(":")
        if key not in GOODPUT_KEYS:
            raise ValueError(f"unknown goodput metric {key!r} (choose from {', '.join(GOODPUT_KEYS)})")
        try:
            out[key] = float(val)
        except ValueError:
            raise ValueError(f"goodput {key}: not a number of ms: {val!r}") from None
        if not 0 < out[key] < float("inf"):  # NaN fails this too
            raise ValueError(f"goodput {key}: must be a finite number > 0 ms (got {val!r})")
    return out


def token_gaps(requests: pd.DataFrame, steps: pd.DataFrame, step_items: pd.DataFrame) -> np.ndarray:
    """Every inter-token latency (s) of every request, from the steps that
    emitted its tokens."""
    items = step_items[step_items["computed_before"] + step_items["tokens"] >= step_items["prompt_tokens"]]
    ends = steps[["instance_id", "step", "end_s"]]
    t = items.merge(ends, on=["instance_id", "step"])[["request_id", "end_s"]].sort_values(["request_id", "end_s"])
    gaps = t.groupby("request_id")["end_s"].diff().dropna().to_numpy(dtype=np.float64)
    return gaps


def _stats(values_s: np.ndarray, percentiles) -> dict | None:
    v = 1e3 * values_s[np.isfinite(values_s)]
    if not v.size:
        return None
    out = {"n": int(v.size), "mean": float(v.mean()), "median": float(np.median(v)), "std": float(v.std())}
    out.update({f"p{p:g}": float(np.percentile(v, p)) for p in percentiles})
    return out


def serving_metrics(requests: pd.DataFrame, percentiles=DEFAULT_PERCENTILES, goodput: dict | None = None,
                    itl_s: np.ndarray | None = None) -> dict:
    """vLLM-style serving metrics of a served trace's requests (ttft_s
    relative to arrival, finish_s absolute). Latencies in ms."""
    arrival = requests["arrival_s"].to_numpy(dtype=np.float64)
    ttft = requests["ttft_s"].to_numpy(dtype=np.float64)
    finish = requests["finish_s"].to_numpy(dtype=np.float64) if "finish_s" in requests else np.full_like(ttft, np.nan)
    out_tok = requests["output_tokens"].to_numpy(dtype=np.float64)
    prompt = requests["prompt_tokens"].to_numpy(dtype=np.float64)
    done = np.isfinite(ttft) & np.isfinite(finish)
    e2e = finish - arrival
    tpot = np.where(done & (out_tok > 1), (e2e - ttft) / np.maximum(out_tok - 1, 1), np.nan)
    duration = float(np.nanmax(finish[done]) - arrival.min()) if done.any() else float("nan")
    m: dict = {"completed": int(done.sum()), "duration_s": duration, "percentiles": list(percentiles),
               "request_throughput": done.sum() / duration if duration > 0 else None,
               "output_throughput": out_tok[done].sum() / duration if duration > 0 else None,
               "total_token_throughput": (out_tok[done] + prompt[done]).sum() / duration if duration > 0 else None}
    for name, vals in (("ttft", np.where(done, ttft, np.nan)), ("tpot", tpot), ("e2el", np.where(done, e2e, np.nan)),
                       ("itl", itl_s if itl_s is not None else np.array([]))):
        m[f"{name}_ms"] = _stats(np.asarray(vals, dtype=np.float64), percentiles)
    if goodput:
        ok = done.copy()
        for key, bound_ms in goodput.items():
            vals = {"ttft": ttft, "tpot": tpot, "e2el": e2e}[key]
            ok &= np.nan_to_num(1e3 * vals, nan=np.inf if key != "tpot" else 0.0) <= bound_ms
        m["goodput"] = {"bounds_ms": dict(goodput), "request_goodput": ok.sum() / duration if duration > 0 else None,
                        "met": int(ok.sum())}
    return m


def slo_goodput(on_time: float, duration_s: float | None) -> float:
    """Requests served within their own TTFT SLO per second of the run:
    vLLM's goodput with each request's SLO as its bound, the figure that
    leads when a pool has no accuracy (quality none)."""
    return on_time / duration_s if duration_s is not None and duration_s > 0 else float("nan")


def cells_slo_goodput(df: pd.DataFrame) -> pd.Series:
    """``slo_goodput`` of each sweep cell (a results.parquet row): its
    serving duration is the completed requests over their throughput."""
    completed = df["requests"] - df["unserved"]
    duration = completed / df["serve_request_throughput__value"]
    return (df["slo_attainment"] * df["requests"] / duration).where(completed > 0)


def tidy(serving: dict, **keys) -> pd.DataFrame:
    """Long rows: metric, stat (mean, median, std, pNN, value), value in ms
    or per second, plus the given key columns (router, rate, seed, ...)."""
    rows = []
    for name in LATENCIES:
        for stat, v in (serving.get(f"{name}_ms") or {}).items():
            if stat != "n":
                rows.append({"metric": f"{name}_ms", "stat": stat, "value": float(v)})
    for name in ("request_throughput", "output_throughput", "total_token_throughput"):
        if serving.get(name) is not None:
            rows.append({"metric": name, "stat": "value", "value": float(serving[name])})
    if serving.get("goodput") and serving["goodput"]["request_goodput"] is not None:
        rows.append({"metric": "request_goodput", "stat": "value", "value": float(serving["goodput"]["request_goodput"])})
    df = pd.DataFrame(rows, columns=["metric", "stat", "value"])
    for k, v in keys.items():
        df.insert(0, k, v)
    return df


def format_serving(m: dict) -> str:
    """The lines ``vllm bench serve`` users read, in ms."""
    lines = [f"completed {m['completed']}, request throughput {m['request_throughput'] or float('nan'):.2f} req/s, "
             f"output {m['output_throughput'] or float('nan'):,.0f} tok/s, total {m['total_token_throughput'] or float('nan'):,.0f} tok/s"]
    if m.get("goodput"):
        g = m["goodput"]
        lines.append(f"goodput {g['request_goodput'] or 0:.2f} req/s ({g['met']} requests met "
                     + ", ".join(f"{k} <= {v:g} ms" for k, v in g["bounds_ms"].items()) + ")")
    for name in LATENCIES:
        s = m.get(f"{name}_ms")
        if s:
            pcts = ", ".join(f"p{p:g} {s[f'p{p:g}']:.1f}" for p in m["percentiles"])
            lines.append(f"{name.upper():<5} ms: mean {s['mean']:.1f}, median {s['median']:.1f}, {pcts}")
        elif name == "itl":
            lines.append("ITL   ms: - (needs token times: a trace with steps, e.g. replay --record-steps)")
    return "\n".join(lines)


def tidy_estimates(metrics: dict) -> pd.DataFrame:
    """An estimate result's metrics in long rows: estimator, load bin
    ("all" or the residents bin), metric (mape, median_ape, ...), value."""
    rows = []
    for name, s in metrics.get("estimators", {}).items():
        for load, block in [("all", s), *s.get("by_load", {}).items()]:
            for k, v in block.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None:
                    rows.append({"estimator": name, "load": load, "metric": k, "value": float(v)})
    return pd.DataFrame(rows, columns=["estimator", "load", "metric", "value"])
