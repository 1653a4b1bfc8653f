"""``latroute demo``: the main job on built-in defaults.

For now it generates a workload on the paper's defaults and summarises it;
the estimator, twin, router and report stages join it as they land. It must
always finish within 2 minutes on 2 cores.
"""
from __future__ import annotations

import time
from pathlib import Path

import click

from traces.arrivals import ArrivalSpec
from traces.store import open_trace
from traces.summary import format_summary, summarize
from traces.workload import WorkloadConfig, write_workload

DEMO_REQUESTS = 4000
DEMO_RATE = 8.0


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("latroute-demo"), show_default=True,
              help="Directory for the demo's outputs (replaced if it exists).")
@click.option("--seed", type=int, default=0, show_default=True)
def demo(out: Path, seed: int) -> None:
    """Run the pipeline on built-in defaults and say where the results are.

    \b
    Example:
      latroute demo --out /tmp/demo
    """
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    workload = out / "workload"
    click.echo(f"[1/1] generating {DEMO_REQUESTS} requests at {DEMO_RATE:g} q/s (Poisson, paper task mix)")
    write_workload(WorkloadConfig(requests=DEMO_REQUESTS, arrivals=ArrivalSpec("poisson", DEMO_RATE), seed=seed),
                   workload, force=True)
    click.echo(format_summary(summarize(open_trace(workload))))
    click.echo(f"\ndone in {time.perf_counter() - t0:.1f} s; outputs in {out.resolve()}")
    click.echo(f"try: latroute trace query {workload} \"select task, count(*) from requests group by task\"")
