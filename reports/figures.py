"""The report's static figures: Matplotlib (Agg) drawings of the specs in
``reports.spec``. Matplotlib is imported here only, when a report is
written, so the CLI starts fast."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from reports.spec import FigureSpec, Panel, Series

MPL_DASH = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-.", "longdash": (0, (8, 3)),
            "longdashdot": (0, (8, 3, 2, 3))}
LABEL_MIN_SEP = 0.06  # point labels closer than this (axes fraction) to a drawn one are left to the legend


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _axes_fraction(ax, x: float, y: float) -> np.ndarray:
    return ax.transAxes.inverted().transform(ax.transData.transform((x, y)))


def place_labels(ax, points: list[tuple[float, float, str]]) -> list:
    """Annotate points, skipping a label that would sit within LABEL_MIN_SEP
    of one already drawn (the series' legend and hover still name them)."""
    drawn, texts = [], []
    for x, y, text in points:
        pos = _axes_fraction(ax, x, y)
        if any(np.hypot(*(pos - d)) < LABEL_MIN_SEP for d in drawn):
            continue
        drawn.append(pos)
        texts.append(ax.annotate(text, (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7))
    return texts


def _draw_series(ax, s: Series) -> None:
    if s.mode == "barh":
        return
    style = {"color": s.color, "label": s.label}
    if s.mode == "markers":
        ax.scatter(s.x, s.y, s=10 if len(s.x) > 1 else 30, alpha=0.5 if len(s.x) > 50 else 1.0,
                   marker="o" if len(s.x) > 1 else "x", **style)
    else:
        ax.plot(s.x, s.y, marker="o" if s.mode == "lines+markers" else None, markersize=4,
                linestyle=MPL_DASH.get(s.dash, "-"), **style)
    if s.band is not None:
        ax.fill_between(s.x, s.band[0], s.band[1], color=s.color, alpha=0.2, linewidth=0)


def _draw_panel(ax, p: Panel) -> None:
    bars = [s for s in p.series if s.mode == "barh"]
    if bars:
        left = np.zeros(len(bars[0].y))
        for s in bars:
            ax.barh(s.y, s.x, left=left, color=s.color, label=s.label)
            left += np.asarray(s.x)
        ax.tick_params(axis="y", labelsize=7)
    for s in p.series:
        _draw_series(ax, s)
    if p.xlog:
        ax.set_xscale("log")
    if p.ylog:
        ax.set_yscale("log")
    if p.equal:
        vals = [v for s in p.series for v in (*s.x, *s.y) if v > 0]
        if vals:
            lo, hi = min(vals) / 1.3, max(vals) * 1.3
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            ax.set_aspect("equal", adjustable="box")
            if p.diagonal:
                ax.plot([lo, hi], [lo, hi], color="black", lw=0.8)
    for x, text in p.vlines:
        ax.axvline(x, color="black", linestyle="--", lw=0.9)
        ax.annotate(text, (x, 0.02), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                    xytext=(-9, 0), textcoords="offset points")
    points = [(x, y, t) for s in p.series if s.text for x, y, t in zip(s.x, s.y, s.text)]
    if points:
        ax.figure.canvas.draw()  # transforms need the final limits
        place_labels(ax, points)
    ax.set_title(p.title, fontsize=9)
    ax.set_xlabel(p.xlabel)
    ax.set_ylabel(p.ylabel)
    ax.grid(alpha=0.3)
    if p.series:
        ax.legend(fontsize=7, loc="lower right" if bars else "best")


SQUARE_PER_ROW = 3  # square (equal-axes) panels per row: each at least 300 px wide at DPI
SQUARE_IN = 4.4  # inches per square panel, labels included
DPI = 110


def draw_png(spec: FigureSpec, path: Path) -> None:
    plt = _plt()
    n = len(spec.panels)
    square = any(p.equal for p in spec.panels)
    bar_rows = max((len(s.y) for p in spec.panels for s in p.series if s.mode == "barh"), default=0)
    rows, cols = 1, n
    if square:  # a strip of n squares would shrink each below readable: wrap into rows
        cols = min(n, SQUARE_PER_ROW)
        rows = -(-n // cols)
        size = (SQUARE_IN * cols, SQUARE_IN * rows)
    elif bar_rows:
        size = (6.5 * n, 0.38 * bar_rows + 1.6)
    else:
        size = (6.4 * n if n > 1 else 6.4, 4)
    fig, axes = plt.subplots(rows, cols, figsize=size, squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_axis_off()
    for ax, p in zip(axes.flat, spec.panels):
        _draw_panel(ax, p)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
