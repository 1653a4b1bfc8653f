"""Options and helpers for the vLLM-style serving metrics (TTFT, TPOT, ITL,
E2E, throughput, goodput) that replay, sweep and validate share; the
metrics themselves are ``reports.serving``."""
from __future__ import annotations

import math
from pathlib import Path

import click

from traces.errors import BadOption
from traces.store import open_trace


def serving_options(f):
    """--metric-percentiles and --goodput, as ``vllm bench serve`` spells
    them (shared by replay, sweep and validate)."""
    f = click.option("--goodput", "goodput_text", metavar="ttft:MS,tpot:MS,e2el:MS",
                     help="Goodput: completed requests per second meeting every bound given (ms), as vLLM's "
                          "--goodput.")(f)
    f = click.option("--metric-percentiles", "percentiles_text", default="50,90,99", show_default=True,
                     help="Percentiles of TTFT, TPOT, ITL and E2E latency to report (ms), comma-separated.")(f)
    return f


def parse_serving(percentiles_text: str | None, goodput_text: str | None) -> tuple[tuple[float, ...], dict]:
    from reports.serving import parse_goodput, parse_percentiles

    try:
        pcts = parse_percentiles(percentiles_text)
    except ValueError as e:
        raise BadOption("--metric-percentiles", str(e)) from None
    try:
        goodput = parse_goodput(goodput_text)
    except ValueError as e:
        raise BadOption("--goodput", str(e)) from None
    for key, ms in goodput.items():  # parse_goodput lets nan and inf through (nan > 0 is false, so is nan <= 0)
        if not math.isfinite(ms):
            raise BadOption("--goodput", f"{key}: must be a finite number of ms > 0 (got {ms})")
    return pcts, goodput


def served_serving_metrics(trace_dir: Path, requests, percentiles, goodput) -> dict:
    """Serving metrics of a served trace, with ITL when it holds steps."""
    from reports.serving import serving_metrics, token_gaps

    t = open_trace(trace_dir)
    itl = token_gaps(requests, t.read("steps"), t.read("step_items")) if t.has("steps") and t.has(
        "step_items") else None
    return serving_metrics(requests, percentiles, goodput, itl)
