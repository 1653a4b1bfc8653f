"""The interactive report: the same figure specs as the static PNGs
(``reports.spec``) drawn with Plotly (hover, zoom, click a legend entry to
hide a series) in one self-contained HTML page: plotly.js is inlined, so the
page opens offline and can be mailed or attached to CI artifacts.

Each figure is a ``<div class="plotly-figure" id="fig-NAME">``; the browser
test checks every one of them rendered.
"""
from __future__ import annotations

import html
import json
import math

from reports.spec import FigureSpec, Panel

PLOTLY_DASH = {"solid": "solid", "dash": "dash", "dot": "dot", "dashdot": "dashdot", "longdash": "longdash",
               "longdashdot": "longdashdot"}


def _rgba(hex_color: str, alpha: float) -> str:
    r, g, b = (int(hex_color[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _axis_position(value: float, log: bool) -> float:
    """Where an annotation at data ``value`` goes: Plotly places annotations
    on a log axis by log10 of the value (shapes and traces by the value)."""
    return math.log10(value) if log else value


def _panel_traces(p: Panel, col: int, seen: set[str]) -> list:
    import plotly.graph_objects as go

    traces = []
    for s in p.series:
        show = s.label not in seen
        seen.add(s.label)
        common = {"name": s.label, "legendgroup": s.group or s.label, "showlegend": show}
        if s.mode == "barh":
            traces.append((go.Bar(x=s.x, y=s.y, orientation="h", marker_color=s.color,
                                  hovertemplate="%{y}: %{x:.1f}%<extra>" + html.escape(s.label) + "</extra>",
                                  **common), col))
            continue
        if s.band is not None:
            traces.append((go.Scatter(x=s.x, y=s.band[0], mode="lines", line={"width": 0}, hoverinfo="skip",
                                      showlegend=False, legendgroup=common["legendgroup"]), col))
            traces.append((go.Scatter(x=s.x, y=s.band[1], mode="lines", line={"width": 0}, fill="tonexty",
                                      fillcolor=_rgba(s.color, 0.2), hoverinfo="skip", showlegend=False,
                                      legendgroup=common["legendgroup"]), col))
        mode = {"lines": "lines", "lines+markers": "lines+markers", "markers": "markers"}[s.mode]
        if s.text:
            mode += "+text"
        traces.append((go.Scatter(x=s.x, y=s.y, mode=mode, text=s.text, textposition="top right",
                                  marker={"color": s.color, "size": 5 if len(s.x) > 1 else 10,
                                          "symbol": "circle" if len(s.x) > 1 else "x",
                                          "opacity": 0.5 if len(s.x) > 50 else 1.0},
                                  line={"color": s.color, "dash": PLOTLY_DASH.get(s.dash, "solid")}, **common), col))
    return traces


def plotly_figure(spec: FigureSpec):
    from plotly.subplots import make_subplots

    n = len(spec.panels)
    bars = any(s.mode == "barh" for p in spec.panels for s in p.series)
    fig = make_subplots(rows=1, cols=n, subplot_titles=[p.title for p in spec.panels],
                        horizontal_spacing=0.22 if bars and n > 1 else 0.06)
    seen: set[str] = set()
    for col, p in enumerate(spec.panels, start=1):
        for trace, c in _panel_traces(p, col, seen):
            fig.add_trace(trace, row=1, col=c)
        fig.update_xaxes(title_text=p.xlabel, type="log" if p.xlog else None, row=1, col=col)
        fig.update_yaxes(title_text=p.ylabel, type="log" if p.ylog else None, row=1, col=col)
        if p.equal:
            vals = [v for s in p.series for v in (*s.x, *s.y) if v > 0]
            if vals:
                lo, hi = math.log10(min(vals) / 1.3), math.log10(max(vals) * 1.3)
                fig.update_xaxes(range=[lo, hi], row=1, col=col)
                fig.update_yaxes(range=[lo, hi], scaleanchor=f"x{col if col > 1 else ''}", row=1, col=col)
                if p.diagonal:
                    fig.add_shape(type="line", x0=10 ** lo, y0=10 ** lo, x1=10 ** hi, y1=10 ** hi,
                                  line={"color": "black", "width": 1}, row=1, col=col)
        for k, (x, text) in enumerate(p.vlines):  # alternate sides so neighbouring labels do not collide
            fig.add_vline(x=x, line_dash="dash", line_color="black", row=1, col=col)
            # The label is its own annotation, not add_vline's: on a log axis Plotly reads a shape's x as
            # data but an annotation's x as log10(data), so add_vline's label sat at 10**x, not at its line.
            top = k % 2 == 0
            fig.add_annotation(x=_axis_position(x, p.xlog), y=1 if top else 0, text=text, showarrow=False,
                               xanchor="right" if top else "left", yanchor="top" if top else "bottom",
                               xref=f"x{col if col > 1 else ''}", yref=f"y{col if col > 1 else ''} domain")
    if bars:
        fig.update_layout(barmode="stack")
    rows = max((len(s.y) for p in spec.panels for s in p.series if s.mode == "barh"), default=0)
    height = max(420, 22 * rows + 160) if rows else (380 if any(p.equal for p in spec.panels) else 440)
    fig.update_layout(height=height, margin={"l": 60, "r": 20, "t": 40, "b": 50}, template="plotly_white",
                      legend={"font": {"size": 10}})
    return fig


def build_interactive(specs: list[FigureSpec], tables: list[tuple[str, tuple[list[str], list[list[str]]], str]],
                      sources: str, table_html) -> str:
    """The whole page as one string (plotly.js inlined once)."""
    from plotly.offline import get_plotlyjs

    body = [f"<h1>latroute report (interactive)</h1><p>Results: {html.escape(sources)}</p>"
            "<p>Hover for values, drag to zoom (double-click resets), click a legend entry to hide it.</p>"]
    scripts = []
    for spec in specs:
        fig = plotly_figure(spec)
        div = f"fig-{spec.name}"
        body.append(f'<figure><div class="plotly-figure" id="{div}"></div>'
                    f"<figcaption>{html.escape(spec.caption)}</figcaption></figure>")
        scripts.append(f"(function(f){{Plotly.newPlot({json.dumps(div)}, f.data, f.layout, "
                       f"{{responsive: true, displaylogo: false}});}})({fig.to_json()});")
    for title, (head, rows), note in tables:
        body.append(f"<h2>{html.escape(title)}</h2>{table_html(head, rows, note)}")
    css = ("body{font-family:system-ui,sans-serif;max-width:1300px;margin:2em auto;padding:0 1em;color:#222}"
           "table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;padding:3px 8px}"
           "th{background:#f3f3f3}figure{margin:1.5em 0}figcaption{color:#444;font-size:0.95em}"
           ".note{color:#444;font-size:0.9em;margin-top:-0.5em}")
    return ("<!doctype html><html><head><meta charset='utf-8'><title>latroute report (interactive)</title>"
            f"<style>{css}</style><script>{get_plotlyjs()}</script></head><body>{''.join(body)}"
            f"<script>{''.join(scripts)}</script></body></html>\n")
