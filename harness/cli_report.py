"""``latroute report`` and ``latroute check``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from reports.check import (
    baseline_doc,
    check_kind,
    compare,
    flatten,
    intervals,
    load_baseline,
    speed_drift_violations,
)
from reports.render import build_report
from reports.results import load_result
from traces.outputs import StagedDir, check_out, write_output_json


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for index.html (static), interactive.html (Plotly), report.md, PNGs.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def report(results: tuple[Path, ...], out: Path, force: bool) -> None:
    """Build an HTML and Markdown report from estimate, validate, replay and
    sweep result directories (any mix).

    \b
    Examples:
      latroute report est-d1 sweep-poisson r-sfs r-sq --out report
      open report/interactive.html    # hover, zoom, toggle series; index.html is the static page
    """
    check_out(out, force, inputs=results)  # before any work
    loaded = [load_result(p) for p in results]
    with StagedDir(out, force) as tmp:
        info = build_report(loaded, tmp)
    click.echo(f"{len(info['figures'])} figures: {', '.join(info['figures']) or 'none'}")
    click.echo(f"wrote {out / 'index.html'}")
    if info.get("interactive"):
        click.echo(f"wrote {out / 'interactive.html'}")


def _tolerances(items: tuple[str, ...]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            v = float(value)
        except ValueError:
            v = -1.0
        if not sep or not name or v < 0:
            raise click.BadParameter(f"expected METRIC=FRACTION (>= 0), got {item!r}", param_hint="--tolerance")
        out[name.strip()] = v
    return out


@click.command()
@click.argument("result", type=click.Path(path_type=Path))
@click.option("--baseline", type=click.Path(path_type=Path), help="Baseline JSON (needed unless only --max-speed-drift gates).")
@click.option("--tolerance", "tolerances", multiple=True,
              help="METRIC=FRACTION: relative change allowed (matches a full name or its suffix, e.g. mape=0.1).")
@click.option("--write-baseline", is_flag=True, help="Write RESULT's metrics as the new baseline and exit 0.")
@click.option("--force", is_flag=True, help="With --write-baseline: replace an existing baseline latroute wrote.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--max-speed-drift", type=click.FloatRange(min=0.0), metavar="FRACTION",
              help="Also fail when an instance's host speed factor against its profile (estimate and validate "
                   "results) is further than FRACTION from 1, e.g. 0.1.")
@click.option("--interval", "use_interval", is_flag=True,
              help="Gate on 95% intervals over seeds where the result has them (sweep --seeds K): a metric "
                   "regresses only when its whole interval is worse than the baseline.")
def check(result: Path, baseline: Path | None, tolerances: tuple[str, ...], write_baseline: bool, force: bool,
          as_json: bool, max_speed_drift: float | None, use_interval: bool) -> None:
    """Regression gate for CI: compare a result's metrics with a baseline.

    Exit 0 when nothing regressed beyond tolerance, 1 when something did,
    2 on bad input. Default tolerances: error metrics (MAPE, APE quantiles,
    TTFT) may grow by 5% of their value, utilities, attainment and AUC may
    shrink by 2%, decision agreement may not drop at all.

    \b
    Examples:
      latroute check est-d1 --baseline ci/est-d1.json --write-baseline
      latroute check est-d1 --baseline ci/est-d1.json --tolerance sfs.mape=0.02
      latroute check est-d1c --max-speed-drift 0.1
    """
    if baseline is None and (max_speed_drift is None or write_baseline):
        raise click.UsageError("give --baseline (or only --max-speed-drift)")
    if write_baseline:  # before any work
        check_out(baseline, force, kind="file", inputs=[result], option="--baseline")
    res = load_result(result)
    drifted = [] if max_speed_drift is None else speed_drift_violations(res, max_speed_drift)
    for line in drifted:
        click.echo(f"DRIFT {line}")
    if baseline is None:
        click.echo(f"{len(drifted)} instance(s) drifted" if drifted else "no instance drifted beyond "
                   f"{100 * max_speed_drift:g}%")
        sys.exit(1 if drifted else 0)
    over = _tolerances(tolerances)
    if write_baseline:
        write_output_json(baseline, baseline_doc(res), "baseline", force=force, option="--baseline")
        click.echo(f"wrote baseline {baseline} ({len(flatten(res))} metrics)")
        return
    base = load_baseline(baseline)
    check_kind(base, res, baseline)
    rows = compare(base["metrics"], flatten(res), over, intervals(res) if use_interval else None)
    bad = [r for r in rows if r.verdict in ("REGRESSED", "missing")]
    if as_json:
        click.echo(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        w = max(len(r.metric) for r in rows) if rows else 10
        click.echo(f"{'metric':<{w}} {'old':>10} {'new':>10} {'change':>8} {'tol':>6}  verdict")
        for r in rows:
            fmt = lambda v: "-" if v is None else f"{v:10.4g}"  # noqa: E731
            ch = "-" if r.change is None else f"{100 * r.change:+7.1f}%"
            click.echo(f"{r.metric:<{w}} {fmt(r.old)} {fmt(r.new)} {ch:>8} {100 * r.tolerance:5.1f}%  {r.verdict}")
        click.echo(f"{len(bad)} regressed of {len(rows)} metrics" if bad else f"no regression in {len(rows)} metrics")
    sys.exit(1 if bad or drifted else 0)
