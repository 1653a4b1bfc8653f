"""``latroute report``: figures, tables and the run's parameters as one
self-contained ``index.html`` (images embedded) plus ``report.md`` and the
PNGs beside them."""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path

from reports.figures import draw_png
from reports.results import Result
from reports.series import _delta_routers, assign_labels, figure_specs, png_name, sweep_cells


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v, fmt="{:.4f}") -> str:
    return "-" if v is None or v != v else fmt.format(v)


def estimator_table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    head = ["result", "estimator", "n", "MAPE", "median APE", "p90 APE", "p99 APE", "median µs"]
    rows = []
    for r in results:
        if r.kind == "estimate":
            for name, s in r.metrics["estimators"].items():
                rows.append([r.label, name, str(s.get("n")), _pct(s.get("mape")), _pct(s.get("median_ape")),
                             _pct(s.get("p90_ape")), _pct(s.get("p99_ape")), _num(s.get("median_us"), "{:.1f}")])
        elif r.kind == "validate":
            t = r.metrics["ttft"]
            rows.append([r.label, "twin replay", str(t.get("n")), _pct(t.get("mape")), _pct(t.get("median_ape")),
                         _pct(t.get("p90_ape")), _pct(t.get("p99_ape")), "-"])
    return head, rows


def router_table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """One row per replay and per sweep cell (router, delta, lambda). Sweep
    rows give the AUC over rates when there are several rates, else the
    value at the one rate, and SLO attainment and TTFT at the highest rate."""
    head = ["result", "router", "OnTimeUtility (AUC for sweeps over rates)", "vs best baseline",
            "SLO attainment", "mean TTFT (s)", "p90 TTFT (s)", "rate (q/s)"]
    rows = []
    for r in results:
        if r.kind == "sweep":
            cells = sweep_cells(r) if "results" in r.tables else None
            for key, v in r.metrics.get("routers", {}).items():
                by_rate = v.get("by_rate", {})
                top = max(by_rate, key=float) if by_rate else None
                at_top = by_rate.get(top, {}) if top else {}
                util = v.get("auc_ontime_utility")
                if util is None and len(by_rate) == 1:
                    util = at_top.get("ontime_utility")
                p90 = None
                if cells is not None and top is not None:
                    c = cells[(cells["router"] == v["router"]) & (cells["rate"] == float(top))
                              & ((cells["delta_per_us"] - v.get("delta_per_us", 0.0)).abs() < 1e-15)]
                    if v.get("lambda") is not None and c["lam"].notna().any():
                        c = c[(c["lam"] - v["lambda"]).abs() < 1e-12]
                    p90 = float(c["ttft_p90_s"].iloc[0]) if len(c) and "ttft_p90_s" in c else None
                rows.append([r.label, key, _num(util), _num(v.get("auc_ratio_to_best_baseline"), "{:.3f}"),
                             _pct(at_top.get("slo_attainment")), _num(at_top.get("ttft_mean_s"), "{:.3f}"),
                             _num(p90, "{:.3f}"), top if top is not None else "-"])
        elif r.kind == "replay":
            m = r.metrics
            rows.append([r.label, m.get("router", "?"), _num(m["ontime_utility"]), "-", _pct(m["slo_attainment"]),
                         _num(m["ttft_mean_s"], "{:.3f}"), _num(m["ttft_p90_s"], "{:.3f}"),
                         _num(m.get("rate", (m.get("workload") if isinstance(m.get("workload"), dict) else {})
                                    .get("rate")), "{:g}")])
    return head, rows


def serving_table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """vLLM-style serving metrics (ms; req/s and tok/s) of replays, validate
    runs (recorded and twin) and sweep cells at their highest rate."""
    pcts: list[float] = []
    entries = []
    for r in results:
        if r.kind == "replay" and r.metrics.get("serving"):
            entries.append((r.label, r.metrics.get("router", "?"), r.metrics["serving"]))
        elif r.kind == "validate" and r.metrics.get("serving"):
            entries += [(r.label, k, s) for k, s in r.metrics["serving"].items()]
        elif r.kind == "sweep" and "results" in r.tables:
            df = r.tables["results"]
            cols = [c for c in df.columns if c.startswith("serve_")]
            if not cols:
                continue
            top = df[df["rate"] == df["rate"].max()].groupby(["router", "delta_per_us"])[cols].mean()
            for (router, delta), row in top.iterrows():
                s: dict = {}
                for c, v in row.items():
                    metric, _, stat = c[6:].partition("__")
                    if metric.endswith("_ms"):
                        s.setdefault(metric, {})[stat] = v
                    else:
                        s[metric] = v
                s["goodput"] = {"request_goodput": s.pop("request_goodput")} if "request_goodput" in s else None
                label = router + (f" δ={delta:g}" if router in _delta_routers(r) else "")
                entries.append((r.label, f"{label} @ {df['rate'].max():g} q/s", s))
    for _, _, s in entries:
        pcts = sorted(set(pcts) | {float(k[1:]) for k in (s.get("ttft_ms") or {}) if k.startswith("p")})
    head = ["result", "run"] + [f"{m.upper()} {'mean' if p is None else f'p{p:g}'} (ms)" for m in ("ttft", "tpot",
                                                                                                    "itl", "e2el")
                                for p in (None, *pcts)] + ["req/s", "output tok/s", "goodput req/s"]
    rows = []
    for label, run, s in entries:
        row = [label, run]
        for m in ("ttft", "tpot", "itl", "e2el"):
            st = s.get(f"{m}_ms") or {}
            row += [_num(st.get("mean"), "{:.1f}")] + [_num(st.get(f"p{p:g}"), "{:.1f}") for p in pcts]
        row += [_num(s.get("request_throughput"), "{:.2f}"), _num(s.get("output_throughput"), "{:,.0f}"),
                _num((s.get("goodput") or {}).get("request_goodput"), "{:.2f}")]
        rows.append(row)
    return head, rows


def params_table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    keys = ("trace", "pool", "router", "lengths", "policies", "profile", "profiles", "arrival", "burst_ratio",
            "burstiness", "requests", "seeds", "rate_range", "lambda", "delta_per_us", "noise", "seed")
    rows = []
    for r in results:
        for k in keys:
            if k in r.metrics:
                v = r.metrics[k]
                rows.append([r.label, r.kind, k, v if isinstance(v, str) else json.dumps(v, default=str)])
    return ["result", "kind", "parameter", "value"], rows


def _md_table(head, rows) -> str:
    if not rows:
        return "_none_\n"
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


def _html_table(head, rows) -> str:
    if not rows:
        return "<p><em>none</em></p>"
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}figure{margin:1.5em 0}figcaption{color:#444;font-size:0.95em}img{max-width:100%}"""


def build_report(results: list[Result], out: Path) -> dict:
    """Write the PNGs, report.md and index.html into ``out`` (a directory
    that exists). Returns {"figures": [...], "html": path}."""
    assign_labels(results)
    specs = figure_specs(results)
    figs = []
    for spec in specs:
        draw_png(spec, out / png_name(spec))
        figs.append((png_name(spec), spec.caption))
    tables = [("Estimator metrics", estimator_table(results)), ("Router metrics", router_table(results)),
              ("Serving metrics (vLLM's definitions)", serving_table(results)),
              ("Parameters", params_table(results))]
    sources = ", ".join(f"{r.label} ({r.kind})" for r in results)
    md = [f"# latroute report\n\nResults: {sources}\n"]
    for name, caption in figs:
        md.append(f"![{caption}]({name})\n\n*{caption}*\n")
    for title, (head, rows) in tables:
        md.append(f"## {title}\n\n{_md_table(head, rows)}")
    (out / "report.md").write_text("\n".join(md))
    body = [f"<h1>latroute report</h1><p>Results: {html.escape(sources)}</p>"]
    for name, caption in figs:
        data = base64.b64encode((out / name).read_bytes()).decode()
        body.append(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    for title, (head, rows) in tables:
        body.append(f"<h2>{html.escape(title)}</h2>{_html_table(head, rows)}")
    try:
        from reports.interactive import build_interactive

        page = build_interactive(specs, tables, sources, _html_table)
    except ImportError:  # plotly is a core dependency; an old environment still gets the static report
        page = None
    if page is not None:
        (out / "interactive.html").write_text(page)
    (out / "index.html").write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>latroute report</title>"
                                    f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")
    return {"figures": [n for n, _ in figs], "html": str(out / "index.html"),
            "interactive": str(out / "interactive.html") if page is not None else None}
