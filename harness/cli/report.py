"""``latroute report`` and ``latroute check``."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from harness.cli.params import NON_NEGATIVE, KeyFraction
from traces.errors import BadInput, BadOption
from traces.files.jsonio import dump_json

# Results, figures and the baseline checks load numpy, pandas, pyarrow, matplotlib and plotly: imported where
# a report is built or a result checked, so that ``--help`` does not pay for them.


def load_result(path: Path):
    """``reports.results.load_result``, imported when a command first reads a result."""
    from reports.results import load_result as load

    return load(path)

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
    from traces.files.outputs import StagedDir, check_out

    check_out(out, force, inputs=results)  # before any work
    from reports.render import build_report
    from reports.result_shape import load_report_result
    from routers.registry import ROUTERS

    loaded = [load_report_result(p) for p in results]  # every value the report reads, checked first
    with StagedDir(out, force) as tmp:
        info = build_report(loaded, tmp, router_order=ROUTERS)  # colours in registry order
    click.echo(f"{len(info['figures'])} figures: {', '.join(info['figures']) or 'none'}")
    click.echo(f"wrote {out / 'index.html'}")
    if info.get("interactive"):
        click.echo(f"wrote {out / 'interactive.html'}")


@click.command()
@click.argument("result", type=click.Path(path_type=Path))
@click.option("--baseline", type=click.Path(path_type=Path), help="Baseline JSON (needed unless only --max-speed-drift gates).")
@click.option("--tolerance", "tolerances", multiple=True, type=KeyFraction(),
              help="METRIC=FRACTION: relative change allowed for the metric of that exact name (estimators.sfs.mape=0.1), or for every metric a glob matches (*.mape=0.1); a name that matches no metric is refused.")
@click.option("--write-baseline", is_flag=True, help="Write RESULT's metrics as the new baseline and exit 0.")
@click.option("--force", is_flag=True, help="With --write-baseline: replace an existing baseline latroute wrote.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option("--max-speed-drift", type=NON_NEGATIVE, metavar="FRACTION",
              help="Also fail when an instance's host speed factor against its profile is further than "
                   "FRACTION from 1, e.g. 0.1. Only estimate and validate results record speed factors: on a "
                   "replay or sweep result the option is refused (exit 2), never passed.")
@click.option("--interval", "use_interval", is_flag=True,
              help="Gate on 95% intervals over seeds where the result has them (sweep --seeds K): a metric "
                   "regresses only when its whole interval is worse than the baseline.")
def check(result: Path, baseline: Path | None, tolerances: tuple[str, ...], write_baseline: bool, force: bool,
          as_json: bool, max_speed_drift: float | None, use_interval: bool) -> None:
    """Regression gate for CI: compare a result's metrics with a baseline.

    Exit 0 when nothing regressed beyond tolerance, 1 when something did,
    2 on bad input (including a metric no result can hold: beyond +-1e12,
    a negative error, an attainment outside [0, 1], or a sweep that is not
    finished). Default tolerances: error metrics (MAPE, APE quantiles,
    TTFT) may grow by 5% of their value, utilities, attainment and AUC may
    shrink by 2%, decision agreement may not drop at all.

    \b
    Examples:
      latroute check est-d1 --baseline ci/est-d1.json --write-baseline
      latroute check est-d1 --baseline ci/est-d1.json --tolerance estimators.sfs.mape=0.02
      latroute check est-d1 --baseline ci/est-d1.json --tolerance '*.p99_ape=0.2'   # a glob: every p99 APE
      latroute check est-d1c --max-speed-drift 0.1
    """
    if baseline is None and (max_speed_drift is None or write_baseline):
        raise BadOption("--baseline", "give --baseline (or only --max-speed-drift)")
    from reports.check import (
        a_kind,
        baseline_doc,
        check_complete,
        check_kind,
        compare,
        flatten,
        intervals,
        load_baseline,
        parse_tolerances,
        speed_drift_violations,
    )
    from traces.files.outputs import check_out, write_output_json

    if write_baseline:  # before any work
        check_out(baseline, force, kind="file", inputs=[result], option="--baseline")
    res = load_result(result)
    check_complete(res)  # a sweep still running (or cut short) is not judged
    drifted = [] if max_speed_drift is None else speed_drift_violations(res, max_speed_drift)
    if baseline is None:
        for line in drifted:
            click.echo(f"DRIFT {line}")
        click.echo(f"{len(drifted)} instance(s) drifted" if drifted else "no instance drifted beyond "
                   f"{100 * max_speed_drift:g}%")
        sys.exit(1 if drifted else 0)
    current = flatten(res)
    if write_baseline and not current:
        raise BadInput(res.path / "metrics.json", None, "metrics",
                       f"no metric of {a_kind(res.kind)} result to gate: a baseline of it would be refused")
    if write_baseline:
        parse_tolerances(tolerances, set(current))
        write_output_json(baseline, baseline_doc(res), "baseline", force=force, option="--baseline")
        click.echo(f"wrote baseline {baseline} ({len(flatten(res))} metrics)")
        return
    # everything is read and checked before anything is printed: a refusal is one line
    base = load_baseline(baseline)
    check_kind(base, res, baseline)
    over = parse_tolerances(tolerances, set(base["metrics"]) | set(current))
    rows = compare(base["metrics"], current, over, intervals(res) if use_interval else None)
    bad = [r for r in rows if r.verdict in ("REGRESSED", "missing")]
    for line in drifted:  # on stderr under --json, so that stdout stays one JSON document
        click.echo(f"DRIFT {line}", err=as_json)
    if as_json:
        click.echo(dump_json([r.__dict__ for r in rows], indent=2))
    else:
        w = max(len(r.metric) for r in rows) if rows else 10
        click.echo(f"{'metric':<{w}} {'old':>10} {'new':>10} {'change':>8} {'tol':>6}  verdict")
        for r in rows:
            fmt = lambda v: "-" if v is None else f"{v:10.4g}"  # noqa: E731
            ch = "-" if r.change is None else f"{100 * r.change:+7.1f}%"
            click.echo(f"{r.metric:<{w}} {fmt(r.old)} {fmt(r.new)} {ch:>8} {100 * r.tolerance:5.1f}%  {r.verdict}")
        click.echo(f"{len(bad)} regressed of {len(rows)} metrics" if bad else f"no regression in {len(rows)} metrics")
    sys.exit(1 if bad or drifted else 0)
