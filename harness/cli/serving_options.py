"""Options and helpers for the vLLM-style serving metrics (TTFT, TPOT, ITL,
E2E, throughput, goodput) that replay, sweep and validate share; the
metrics themselves are ``reports.serving``."""
from __future__ import annotations

import math
from pathlib import Path

import click

from traces.errors import BadOption

GOODPUT_MAX_MS = 1e9  # a bound of ~11.6 days: past it every request meets it (harness.cli.params.MAX_MAGNITUDE)


def check_percentiles(text: object) -> tuple[float, ...]:
    """``50,90,99``: one or more distinct finite numbers in (0, 100]; an
    empty list or item is refused (not read as the default), since the
    user asked for something. BadOption otherwise."""
    parts = [p.strip() for p in str(text).split(",")] if text is not None else []
    if not parts or parts == [""]:
        raise BadOption("--metric-percentiles", "empty: give one or more percentiles in (0, 100], e.g. 50,90,99")
    out: list[float] = []
    for i, part in enumerate(parts, 1):
        try:
            x = float(part) if part and len(part) <= 64 else math.nan
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and 0 < x <= 100):
            raise BadOption("--metric-percentiles", f"item {i} must be a percentile in (0, 100] (got {part!r})")
        if x in out:
            raise BadOption("--metric-percentiles", f"item {i} repeats {part!r}: give each percentile once")
        out.append(x)
    return tuple(out)


def check_goodput(text: object) -> dict[str, float]:
    """``ttft:MS,tpot:MS,e2el:MS``: each metric at most once, each bound a
    finite number of ms in (0, 1e9]; empty (or an empty item) refused."""
    from reports.serving import GOODPUT_KEYS

    parts = [p.strip() for p in str(text).replace(" ", ",").split(",")] if text is not None else []
    if not parts or parts == [""]:
        raise BadOption("--goodput", f"empty: give one or more of {', '.join(GOODPUT_KEYS)} as KEY:MS, e.g. ttft:200")
    out: dict[str, float] = {}
    for i, part in enumerate(parts, 1):
        key, sep, raw = part.partition(":")
        key = key.strip()
        if not sep or key not in GOODPUT_KEYS:
            raise BadOption("--goodput", f"item {i} ({part!r}) is not KEY:MS with KEY one of {', '.join(GOODPUT_KEYS)}")
        if key in out:
            raise BadOption("--goodput", f"{key} given twice")
        try:
            ms = float(raw) if len(raw) <= 64 else math.nan
        except ValueError:
            ms = math.nan
        if not (math.isfinite(ms) and 0 < ms <= GOODPUT_MAX_MS):
            raise BadOption("--goodput", f"{key}: must be a finite number of ms in (0, {GOODPUT_MAX_MS:g}] (got {raw!r})")
        out[key] = ms
    return out


class _Checked(click.ParamType):
    """Checked while the command line is parsed (before any trace is read);
    the text is kept for the command, which parses it again."""

    def __init__(self, check, metavar: str) -> None:
        self.check, self.metavar = check, metavar

    def convert(self, value, param, ctx):
        try:
            self.check(value)
        except BadOption as e:
            self.fail(e.reason, param, ctx)
        return value

    def get_metavar(self, param, ctx) -> str:
        return self.metavar


def serving_options(f):
    """--metric-percentiles and --goodput, as ``vllm bench serve`` spells
    them (shared by replay, sweep and validate)."""
    f = click.option("--goodput", "goodput_text", type=_Checked(check_goodput, "ttft:MS,tpot:MS,e2el:MS"),
                     help="Goodput: completed requests per second meeting every bound given (ms, each in (0, 1e9], "
                          "each metric once), as vLLM's --goodput.")(f)
    f = click.option("--metric-percentiles", "percentiles_text", default="50,90,99", show_default=True,
                     type=_Checked(check_percentiles, "P,P,..."),
                     help="Percentiles of TTFT, TPOT, ITL and E2E latency to report (ms), comma-separated, each "
                          "in (0, 100] and given once.")(f)
    return f


def parse_serving(percentiles_text: str | None, goodput_text: str | None) -> tuple[tuple[float, ...], dict]:
    """The two options' values (None: not given, the defaults); the checks
    of ``check_percentiles``/``check_goodput`` also hold for values that did
    not come through the command line (``sweep --spec``)."""
    from reports.serving import DEFAULT_PERCENTILES

    pcts = DEFAULT_PERCENTILES if percentiles_text is None else check_percentiles(percentiles_text)
    goodput = {} if goodput_text is None else check_goodput(goodput_text)
    return pcts, goodput


def served_serving_metrics(trace_dir: Path, requests, percentiles, goodput) -> dict:
    """Serving metrics of a served trace, with ITL when it holds steps."""
    from reports.serving import serving_metrics, token_gaps
    from traces.store import open_trace

    t = open_trace(trace_dir)
    itl = token_gaps(requests, t.read("steps"), t.read("step_items")) if t.has("steps") and t.has(
        "step_items") else None
    return serving_metrics(requests, percentiles, goodput, itl)
