"""``latroute trace info``: what is in a trace, computed with DuckDB so it
works on traces far larger than memory."""
from __future__ import annotations

from typing import Any

from traces.errors import BadInput
from traces.store import Trace

PCTS = (0.5, 0.9, 0.99)


def _pct_sql(col: str) -> str:
    return ", ".join(f"quantile_cont({col}, {p})" for p in PCTS)


def summarize(trace: Trace) -> dict[str, Any]:
    """The summary; a table DuckDB cannot read (bytes corrupted inside, the
    footer whole) is refused naming its file, not an internal error."""
    import duckdb

    try:
        return _summarize(trace)
    except duckdb.Error as e:
        text = str(e)
        name = next((n for n in trace.tables if trace.file(n).name in text), None) or _unreadable(trace)
        where = trace.file(name) if name else trace.path
        raise BadInput(where, None, name or "trace",
                       f"not a readable Parquet file ({text.splitlines()[0][:200]})") from None


def _unreadable(trace: Trace) -> str | None:
    """The first table whose cells pyarrow cannot read either (DuckDB's
    message does not always name the file)."""
    import pyarrow.parquet as pq

    for n in trace.tables:
        try:
            pq.read_table(trace.file(n))
        except Exception:  # noqa: BLE001 (any failure to read is the answer)
            return n
    return None


def _summarize(trace: Trace) -> dict[str, Any]:
    con = trace.connect()
    cols = {name: set(trace.columns(name)) for name in trace.tables}
    info: dict[str, Any] = {
        "path": str(trace.path),
        "source": trace.meta.get("source", {}),
        "arrivals": trace.meta.get("arrivals"),
        "tables": {name: con.execute(f"select count(*) from {name}").fetchone()[0] for name in trace.tables},
    }
    if trace.meta.get("completeness"):
        info["completeness"] = trace.meta["completeness"]
    if trace.meta.get("engine"):
        info["engine"] = _engine_summary(trace.meta["engine"])
    if trace.has("requests"):
        n, t_min, t_max = con.execute("select count(*), min(arrival_s), max(arrival_s) from requests").fetchone()
        if t_min is not None:
            t_min, t_max = t_min + 0.0, t_max + 0.0  # DuckDB can report a zero minimum as -0.0
        span = (t_max - t_min) if t_min is not None else None
        info["requests"] = {
            "count": n,
            "first_arrival_s": t_min,
            "last_arrival_s": t_max,
            "span_s": span,
            "rate_per_s": (n - 1) / span if span else None,
        }
        for label, col in (("prompt_tokens", "prompt_tokens"), ("output_tokens", "output_tokens")):
            row = con.execute(f"select avg({col}), {_pct_sql(col)}, max({col}) from requests").fetchone()
            info[label] = {"mean": row[0], **{f"p{int(p * 100)}": v for p, v in zip(PCTS, row[1:-1])}, "max": row[-1]}
        if "ttft_s" in cols["requests"]:
            row = con.execute(f"select count(ttft_s), avg(ttft_s), {_pct_sql('ttft_s')} from requests").fetchone()
            if row[0]:
                info["ttft_s"] = {"count": row[0], "mean": row[1],
                                  **{f"p{int(p * 100)}": v for p, v in zip(PCTS, row[2:])}}
        if "hash_ids" in cols["requests"] and trace.meta.get("hash_block_tokens"):
            info["prefix"] = _prefix_summary(trace, "cached_tokens" in cols["requests"])
        if "task" in cols["requests"]:
            info["tasks"] = dict(con.execute(
                "select coalesce(task, '(none)'), count(*) from requests group by 1 order by 2 desc, 1").fetchall())
    instances: list[str] = []
    if trace.has("instances"):
        instances = [r[0] for r in con.execute("select instance_id from instances order by 1").fetchall()]
    elif trace.has("requests") and "instance_id" in cols["requests"]:
        instances = [r[0] for r in con.execute(
            "select distinct instance_id from requests where instance_id is not null order by 1").fetchall()]
    info["instances"] = instances
    if trace.has("steps"):
        row = con.execute("select count(*), min(start_s), max(end_s), avg(end_s - start_s) from steps").fetchone()
        info["steps"] = {"count": row[0], "first_start_s": row[1], "last_end_s": row[2], "mean_duration_s": row[3]}
    con.close()
    return info


def _engine_summary(engine: dict) -> dict[str, Any]:
    """How the trace's engine settings are known: how many given, inferred, defaulted (which ones), and
    the unmodelled settings its import accepted."""
    marks = engine.get("marks") or {}
    settings = engine.get("settings") or {}
    out: dict[str, Any] = {k: sorted(s for s, m in marks.items() if m == k) for k in ("given", "inferred", "defaulted")}
    for key in ("vllm_version", "gpu"):
        if key in settings:
            out[key] = {"value": settings[key], "mark": marks.get(key)}
    out["accepted_unmodelled"] = list(engine.get("accepted_unmodelled") or [])
    out["not_modelled"] = list(engine.get("not_modelled") or [])
    return out


def _completeness_line(done: dict) -> str:
    status, logged, sent, missing = done.get("status"), done.get("logged"), done.get("sent"), done.get("missing")
    if status == "complete":
        return f"complete: {logged} of {sent} sent logged"
    if status == "incomplete":
        of = f"{missing} of {sent}" if sent is not None else f"at least {missing}"
        return (f"{of} missing ({logged} logged" + (f"; {done['where']}" if done.get("where") else "") + ")"
                + ("; imported with --allow-incomplete" if done.get("allowed") else ""))
    return f"unknown ({logged} logged; {done.get('how') or 'the run size is not stated'})"


def _prefix_summary(trace: Trace, recorded: bool) -> dict[str, Any]:
    """The trace's ideal prefix-cache hit rate: the share of prompt tokens in
    hash blocks an earlier request already had (infinite cache, arrival
    order, whole hash blocks); recordings add the hit rate they measured."""
    from traces.datamodel.prefix_blocks import ideal_hit_tokens

    cols = ["prompt_tokens", "hash_ids"] + (["cached_tokens"] if recorded else [])
    r = trace.read("requests", cols)
    hit, total = ideal_hit_tokens(r["hash_ids"].tolist(), r["prompt_tokens"].tolist(),
                                  int(trace.meta["hash_block_tokens"]))
    out: dict[str, Any] = {"hash_block_tokens": int(trace.meta["hash_block_tokens"]),
                           "ideal_hit_rate": hit / total if total else None}
    if recorded and total:
        out["recorded_hit_rate"] = float(r["cached_tokens"].fillna(0).sum()) / total
    return out


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def format_summary(info: dict[str, Any]) -> str:
    src = info.get("source") or {}
    lines = [f"trace          {info['path']}",
             f"source         {src.get('kind', '?')}" + (f" ({src.get('file') or src.get('dir')})" if src.get("file") or src.get("dir") else ""),
             "tables         " + ", ".join(f"{k} ({v:,} rows)" for k, v in info["tables"].items())]
    if "requests" in info:
        r = info["requests"]
        lines.append(f"requests       {r['count']:,} over {_fmt(r['span_s'])} s, {_fmt(r['rate_per_s'])} req/s"
                     + (f" (arrivals {info['arrivals']})" if info.get("arrivals") else ""))
        for key in ("prompt_tokens", "output_tokens", "ttft_s"):
            if key in info:
                d = info[key]
                lines.append(f"{key:<14} " + "  ".join(f"{k} {_fmt(v)}" for k, v in d.items() if k != "count"))
        if "prefix" in info:
            p = info["prefix"]
            lines.append(f"prefix cache   ideal hit rate {_fmt(p['ideal_hit_rate'])} (infinite cache, "
                         f"{p['hash_block_tokens']}-token blocks)"
                         + (f", recorded {_fmt(p['recorded_hit_rate'])}" if "recorded_hit_rate" in p else ""))
        if info.get("tasks"):
            lines.append("tasks          " + ", ".join(f"{k} {v:,}" for k, v in info["tasks"].items()))
    if info.get("completeness"):
        lines.append("completeness   " + _completeness_line(info["completeness"]))
    if info.get("engine"):
        e = info["engine"]
        about = ", ".join(f"{k.replace('_', ' ')} {_fmt(e[k]['value'])} ({e[k]['mark']})"
                          for k in ("vllm_version", "gpu") if k in e)
        lines.append("engine         " + (about + "; " if about else "")
                     + ", ".join(f"{len(e[k])} {k}" for k in ("given", "inferred", "defaulted"))
                     + (f" (defaulted: {', '.join(e['defaulted'])})" if e["defaulted"] else ""))
        if e["accepted_unmodelled"]:
            lines.append("not modelled   " + ", ".join(e["accepted_unmodelled"])
                         + " (accepted at import: every result from this trace carries it)")
    if info.get("instances"):
        lines.append("instances      " + ", ".join(info["instances"]))
    if "steps" in info:
        s = info["steps"]
        lines.append(f"steps          {s['count']:,}, mean duration {_fmt(s['mean_duration_s'])} s")
    return "\n".join(lines)
