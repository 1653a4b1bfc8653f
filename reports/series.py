"""Which figures a report draws, in order, with one palette for routers
and one for estimators shared by all of them (a router keeps one colour
across every figure of a report; a soft router's deltas differ by dash).

The figures themselves are in ``reports.estimate_figures`` and
``reports.router_figures``, their data model in ``reports.spec``, the
colours in ``reports.colours``; the names below are re-exported for the
callers that import them from here.
"""
from __future__ import annotations

from reports.colours import Palette
from reports.estimate_figures import (
    APE_FLOOR,
    ape_cdf,
    error_by_cached_share,
    estimate_scatter,
    mape_by_load,
    ttft_reliability,
)
from reports.results import Result
from reports.router_figures import attainment_vs_rate, composition, frontier, ontime_vs_rate, ttft_cdf
from reports.spec import FigureSpec, Panel, Series, assign_labels, png_name
from reports.sweep_cells import delta_routers, sweep_cells

__all__ = ["APE_FLOOR", "ESTIMATOR_FIGURES", "FigureSpec", "Palette", "Panel", "ROUTER_FIGURES", "Series",
           "assign_labels", "delta_routers", "error_by_cached_share", "figure_specs", "png_name", "sweep_cells"]

ROUTER_FIGURES = (ontime_vs_rate, attainment_vs_rate, frontier, composition, ttft_cdf)
ESTIMATOR_FIGURES = (estimate_scatter, ape_cdf, mape_by_load, error_by_cached_share, ttft_reliability)


def figure_specs(results: list[Result], router_order=()) -> list[FigureSpec]:
    """Every figure the results hold data for, in report order, with one
    palette for routers and one for estimators shared by all figures.
    ``router_order``: the order routers take their colours in (the CLI
    passes the router registry's; routers not in it follow by name)."""
    routers = set()
    for r in results:
        if r.kind == "sweep" and "results" in r.tables:
            routers |= set(r.tables["results"]["router"])
        elif r.kind == "replay":
            routers.add(r.metrics.get("router", r.label))
    estimators = sorted({n for r in results if r.kind == "estimate" for n in r.metrics.get("estimators", {})})
    pal, pal_est = Palette(routers, router_order), Palette(estimators)
    specs = [fn(results, pal_est) for fn in ESTIMATOR_FIGURES] + [fn(results, pal) for fn in ROUTER_FIGURES]
    return [s for s in specs if s is not None]
