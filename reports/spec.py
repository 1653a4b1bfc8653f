"""What each report figure shows, as data: panels of named series with
their colours, scales and markers, and a caption computed from the numbers.

Both renderers draw from these specs (Matplotlib for the static PNGs in
``reports.figures``, Plotly for the interactive page in
``reports.interactive``), so the two can never disagree, and the tests
check the figures' content without reading pixels."""
from __future__ import annotations

from dataclasses import dataclass, field

from reports.results import Result

DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"]


@dataclass
class Series:
    label: str
    x: list
    y: list
    color: str
    mode: str = "lines+markers"  # lines | lines+markers | markers | barh
    dash: str = "solid"
    band: tuple[list, list] | None = None  # (low, high): a 95% interval over seeds
    text: list[str] | None = None  # per-point labels drawn next to the points
    group: str = ""  # what the series belongs to (router or estimator), for toggling


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series]
    xlog: bool = False
    ylog: bool = False
    equal: bool = False  # same range on both axes, square panel
    diagonal: bool = False  # the y = x line
    vlines: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class FigureSpec:
    name: str  # file stem: <name>.png, and the plot element's id in the interactive page
    caption: str
    panels: list[Panel]


def assign_labels(results: list[Result]) -> None:
    """Give each result the shortest trailing part of its path that no other
    result shares (``a/sweep`` and ``b/sweep``, not two ``sweep``)."""
    parts = [r.path.resolve().parts for r in results]
    for i, r in enumerate(results):
        depth = 1
        while depth < len(parts[i]) and any(
                j != i and parts[j][-depth:] == parts[i][-depth:] for j in range(len(results))):
            depth += 1
        r.display = "/".join(parts[i][-depth:])


def fmt_delta(d: float) -> str:
    return f"{d:g}"


def png_name(spec: FigureSpec) -> str:
    return f"{spec.name}.png"
