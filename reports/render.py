"""``latroute report``: figures, tables and the run's parameters as one
self-contained ``index.html`` (images embedded) plus ``report.md`` and the
PNGs beside them."""
from __future__ import annotations

import base64
import html
from pathlib import Path

from reports.figures import draw_png
from reports.results import Result
from reports.series import assign_labels, figure_specs, png_name
from reports.tables import (
    estimator_table,
    html_table,
    md_table,
    params_table,
    router_note,
    router_table,
    serving_note,
    serving_table,
)

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}figure{margin:1.5em 0}figcaption{color:#444;font-size:0.95em}img{max-width:100%}
.note{color:#444;font-size:0.9em;margin-top:-0.5em}"""


def build_report(results: list[Result], out: Path, router_order=()) -> dict:
    """Write the PNGs, report.md and index.html into ``out`` (a directory
    that exists). ``router_order``: the order routers take their colours in
    (``reports.colours``; the CLI passes the router registry's). Returns
    {"figures": [...], "html": path}."""
    assign_labels(results)
    specs = figure_specs(results, router_order)
    figs = []
    for spec in specs:
        draw_png(spec, out / png_name(spec))
        figs.append((png_name(spec), spec.caption))
    tables = [("Estimator metrics", estimator_table(results), ""), ("Router metrics", router_table(results),
                                                                         router_note(results)),
              ("Serving metrics (vLLM's definitions)", serving_table(results), serving_note(results)),
              ("Parameters", params_table(results), "")]
    sources = ", ".join(f"{r.label} ({r.kind})" for r in results)
    md = [f"# latroute report\n\nResults: {sources}\n"]
    for name, caption in figs:
        md.append(f"![{caption}]({name})\n\n*{caption}*\n")
    for title, (head, rows), note in tables:
        md.append(f"## {title}\n\n{md_table(head, rows, note)}")
    (out / "report.md").write_text("\n".join(md))
    body = [f"<h1>latroute report</h1><p>Results: {html.escape(sources)}</p>"]
    for name, caption in figs:
        data = base64.b64encode((out / name).read_bytes()).decode()
        body.append(f'<figure><img alt="{html.escape(name)}" src="data:image/png;base64,{data}">'
                    f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    for title, (head, rows), note in tables:
        body.append(f"<h2>{html.escape(title)}</h2>{html_table(head, rows, note)}")
    try:
        from reports.interactive import build_interactive

        page = build_interactive(specs, tables, sources, html_table)
    except ImportError:  # plotly is a core dependency; an old environment still gets the static report
        page = None
    if page is not None:
        (out / "interactive.html").write_text(page)
    (out / "index.html").write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>latroute report</title>"
                                    f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")
    return {"figures": [n for n, _ in figs], "html": str(out / "index.html"),
            "interactive": str(out / "interactive.html") if page is not None else None}
