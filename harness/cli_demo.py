"""``latroute demo``: the main job on built-in defaults.

For now it generates a workload on the paper's defaults and summarises it,
then calibrates a batch-time profile from engine steps whose true model is
the built-in qwen3-8b H100 profile (synthetic batches until the engine twin
exists), showing how well calibration recovers it. The twin, estimator,
router and report stages join as they land. It must always finish within 2
minutes on 2 cores.
"""
from __future__ import annotations

import time
from pathlib import Path

import click

from estimators.calibrate import CalibrationConfig, best_form, build_profile, fit_forms, load_steps
from estimators.profile import load_profile
from estimators.synthetic_steps import synthetic_steps
from harness.cli_calibrate import format_profile, format_results
from traces.arrivals import ArrivalSpec
from traces.store import TraceWriter, open_trace
from traces.summary import format_summary, summarize
from traces.workload import WorkloadConfig, write_workload

DEMO_REQUESTS = 4000
DEMO_RATE = 8.0
DEMO_STEPS = 20_000
DEMO_PROFILE = "qwen3-8b-h100"


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
    click.echo(f"[1/2] generating {DEMO_REQUESTS} requests at {DEMO_RATE:g} q/s (Poisson, paper task mix)")
    write_workload(WorkloadConfig(requests=DEMO_REQUESTS, arrivals=ArrivalSpec("poisson", DEMO_RATE), seed=seed),
                   workload, force=True)
    click.echo(format_summary(summarize(open_trace(workload))))

    truth = load_profile(DEMO_PROFILE)
    click.echo(f"\n[2/2] calibrating a batch-time profile from {DEMO_STEPS:,} steps drawn from {DEMO_PROFILE} "
               f"(jitter sigma {truth.noise.log_sigma}, stalls {100 * truth.noise.p_stall:g}%)")
    steps, _ = synthetic_steps(truth.form, truth.coefficients, truth.noise, DEMO_STEPS, seed=seed,
                               instance_id="qwen3-8b")
    with TraceWriter(out / "steps", force=True) as w:
        w.meta["source"] = {"kind": "synthetic-steps", "profile": DEMO_PROFILE, "seed": seed}
        w.write_table("steps", steps)
    cfg = CalibrationConfig(seed=seed)
    data = load_steps([out / "steps"])
    results = fit_forms(data.steps, cfg)
    chosen = best_form(results)
    profile = build_profile("demo-qwen3-8b", results[chosen], data, cfg)
    profile.save(out / "profile.json")
    click.echo(format_results(results, chosen))
    click.echo(format_profile(profile))
    if chosen == truth.form:
        ratio = "  ".join(f"{v:.3f}" for v in profile.coefficients / truth.coefficients)
        click.echo(f"recovered / true coefficients: {ratio}")
    click.echo(f"\ndone in {time.perf_counter() - t0:.1f} s; outputs in {out.resolve()}")
    click.echo(f"try: latroute trace query {workload} \"select task, count(*) from requests group by task\"")
