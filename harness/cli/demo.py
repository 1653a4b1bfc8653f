"""``latroute demo``: the main job on built-in defaults.

It generates a workload on the paper's defaults, replays it on the engine
twin of pool qwen3-h100 (shortest-queue routing, noise on) to get
"recorded" steps, calibrates a batch-time profile from the qwen3-8b
instance's steps (showing how well calibration recovers the built-in
profile that generated them), scores the TTFT estimators on every
request of the twin trace, sweeps the main routers over a few arrival
rates, replays them at the highest rate, and writes an HTML report whose
path it prints last. It must always finish within 2 minutes on 2 cores.
"""
from __future__ import annotations

import time
from pathlib import Path

import click

from harness.cli.params import SEED

# Every step of the demo loads numba, numpy, pandas, duckdb and matplotlib: imported where it runs, so that
# ``latroute demo --help`` does not pay for them.


def load_profile(ref: str):
    """``estimators.timemodel.profile.load_profile``, imported when the demo first loads a profile."""
    from estimators.timemodel.profile import load_profile as load

    return load(ref)


DEMO_REQUESTS = 4000
DEMO_RATE = 8.0
DEMO_POOL = "qwen3-h100"
DEMO_INSTANCE = "qwen3-8b"
DEMO_SWEEP_RATES = (4.0, 6.0, 8.0)
DEMO_SWEEP_REQUESTS = 2000
DEMO_DELTAS = (0.0, 1e-7, 1e-6, 1e-5, 1e-4)
DEMO_DELTA = 1e-6  # routers that use a delta, in the sweep and the replays


@click.command()
@click.option("--out", type=click.Path(path_type=Path), default=Path("latroute-demo"), show_default=True,
              help="Directory for the demo's outputs (an earlier demo's there is replaced; any other latroute "
                   "output only with --force).")
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Seed of the workload, the twin's noise and every replay and sweep cell.")
@click.option("--force", is_flag=True, help="Replace --out even if it holds another latroute output (a trace, a "
                                            "sweep), not an earlier demo's.")
def demo(out: Path, seed: int, force: bool) -> None:
    """Run the pipeline on built-in defaults and say where the results are.

    \b
    Example:
      latroute demo --out /tmp/demo
    """
    t0 = time.perf_counter()
    # a new directory, an empty one, or an earlier demo's (its marker): the demo replaces its own outputs
    # every run, and nothing else (a directory of someone's files is refused before any work; another latroute
    # output, such as a trace, without --force: it once was replaced after a full run). Everything is
    # built in a pid-named temporary beside OUT and renamed onto it at the end, so a killed demo leaves no
    # partial OUT (the next run removes the temporary of a dead pid).
    from traces.errors import BadOption
    from traces.files.outputs import StagedDir, check_out, dir_kind

    check_out(out, force=True, owner="latroute demo")
    kind = dir_kind(out) if out.is_dir() and any(out.iterdir()) else "demo"
    if kind != "demo" and not force:
        raise BadOption("--out", f"{out} holds a latroute {kind or 'output'}, not an earlier demo's: pass --force "
                                 "to replace it")
    with StagedDir(out, force=True, kind="demo") as root:
        _run_demo(out, Path(root), seed)
    click.echo(f"\ndone in {time.perf_counter() - t0:.1f} s; outputs in {out.resolve()}")
    click.echo(f"try: latroute trace query {out / 'served'} \"select instance_id, count(*), avg(ttft_s) from "
               f"requests group by 1\"")


def _run_demo(out: Path, root: Path, seed: int) -> None:
    """The demo's steps, writing under ``root`` (the staging directory);
    paths recorded in the outputs and shown name ``out``, where they end up."""
    from estimators.estimate import BaselineParams, EstimateConfig, estimate_trace
    from estimators.timemodel.calibrate import (
        CalibrationConfig,
        best_form,
        build_profile,
        calibrate_instance,
        fit_forms,
        load_steps,
    )
    from harness.cli.calibrate import format_profile, format_results
    from harness.cli.estimate import format_metrics
    from harness.cli.replay import write_replay_result
    from harness.cli.sweep import format_sweep
    from harness.sweep.backends import default_workers
    from harness.sweep.driver import Cell, SweepSpec, run_and_write_sweep
    from harness.twin.pools.spec import load_pool
    from harness.twin.replay import ReplayConfig, replay, warm_up
    from harness.twin.simulation import Twin, TwinConfig, shortest_queue_router, write_twin_trace
    from reports.render import build_report
    from reports.results import command_line, load_result, result_header
    from reports.serving import tidy_estimates
    from routers.registry import MAIN_ROUTERS, ROUTERS, router_entry
    from traces.files.outputs import StagedDir, write_json, write_parquet
    from traces.store import TraceWriter, open_trace
    from traces.summary import format_summary, summarize
    from traces.workload.arrivals import ArrivalSpec
    from traces.workload.generator import WorkloadConfig, generate_workload, write_workload

    workload = root / "workload"
    cfg = WorkloadConfig(requests=DEMO_REQUESTS, arrivals=ArrivalSpec("poisson", DEMO_RATE), seed=seed)
    click.echo(f"[1/6] generating {DEMO_REQUESTS} requests at {DEMO_RATE:g} q/s (Poisson, paper task mix)")
    write_workload(cfg, workload, force=True)
    click.echo(format_summary(summarize(open_trace(workload))))

    click.echo(f"\n[2/6] replaying them on the engine twin of pool {DEMO_POOL} (shortest-queue, noise on)")
    pool = load_pool(DEMO_POOL)
    twin = Twin.from_pool(pool, TwinConfig(seed=seed))
    # Numba's compile (or cache load) on a toy replay of this pool and router, so that the speed below is steady state
    compile_s = warm_up(twin.specs, shortest_queue_router)
    t = time.perf_counter()
    res = twin.run(generate_workload(cfg).requests, shortest_queue_router)
    wall = time.perf_counter() - t
    served = root / "served"
    with TraceWriter(served, force=True) as w:
        w.meta["source"] = {"kind": "twin", "pool": DEMO_POOL, "router": "shortest-queue", "seed": seed,
                            "workload": str(out / "workload")}
        w.meta["arrivals"] = "measured"
        w.meta["frontend_overhead_s"] = pool.frontend_overhead_s
        write_twin_trace(w, res)
    click.echo(f"{res.steps_run:,} steps over {res.sim_end_s:,.0f} simulated s in {wall:.1f} s "
               f"({res.sim_end_s / wall:,.0f}x real time with step logging, steady state; the kernels' compile "
               f"or cache load before it took {compile_s:.1f} s)")
    by = res.requests.groupby("instance_id")["ttft_s"]
    for inst, g in by:
        click.echo(f"  {inst:<11} {len(g):>5} requests  TTFT mean {g.mean():.3f} s  p90 {g.quantile(0.9):.3f} s")

    truth = load_profile(f"{DEMO_INSTANCE}-h100")
    click.echo(f"\n[3/6] calibrating a batch-time profile from the twin's {DEMO_INSTANCE} steps "
               f"(truth: built-in {truth.name}, jitter sigma {truth.noise.log_sigma}, stalls "
               f"{100 * truth.noise.p_stall:g}%)")
    ccfg = CalibrationConfig(seed=seed, instance=DEMO_INSTANCE)
    data = load_steps([served], DEMO_INSTANCE)
    results = fit_forms(data.steps, ccfg)
    chosen = best_form(results)
    profile = build_profile(f"demo-{DEMO_INSTANCE}", results[chosen], data, ccfg)
    for src in (profile.fitted_on or {}).get("traces", []):  # name the trace where it ends up, not the staging
        if isinstance(src, dict) and src.get("trace") == str(served):
            src["trace"] = str(out / "served")
    profile.save(root / "profile.json")
    click.echo(format_results(results, chosen))
    click.echo(format_profile(profile))
    if chosen == truth.form:
        ratio = "  ".join(f"{v:.3f}" for v in profile.coefficients / truth.coefficients)
        click.echo(f"recovered / true coefficients: {ratio}")
    click.echo("\n[4/6] estimating every request's TTFT from honest snapshots of the twin trace (profiles "
               "calibrated per instance on its own steps; predicted output lengths for residents)")
    served_trace = open_trace(served)
    models = {inst: (calibrate_instance(served, inst, seed, f"demo-{inst}"), None) for inst in res.instances["instance_id"]}
    for inst, (prof, _) in models.items():
        models[inst] = (prof, BaselineParams.from_derived(prof.derived))
    est = estimate_trace(served_trace, models, EstimateConfig(lengths="column",
                                                              frontend_overhead_s=pool.frontend_overhead_s))
    with StagedDir(root / "estimates", force=True) as tmp:
        write_parquet(tmp / "estimates.parquet", est.estimates)
        write_parquet(tmp / "attribution.parquet", est.attribution)
        write_json(tmp / "metrics.json", {**result_header("estimate"), **est.metrics, "trace": str(out / "served")})
        write_parquet(tmp / "metrics.parquet", tidy_estimates(est.metrics))
    click.echo(format_metrics(est.metrics))

    cells = [Cell(rate, router, DEMO_DELTA if router_entry(router).uses_delta else 0.0, seed=seed)
             for router in MAIN_ROUTERS for rate in DEMO_SWEEP_RATES]
    click.echo(f"\n[5/6] sweeping {len(MAIN_ROUTERS)} routers over {len(DEMO_SWEEP_RATES)} arrival rates "
               f"({DEMO_SWEEP_REQUESTS} requests per cell, sfs-soft with delta 1e-6 per us)")
    spec = SweepSpec(pool=DEMO_POOL, requests=DEMO_SWEEP_REQUESTS)
    df, summary = run_and_write_sweep(root / "sweep", spec, cells, default_workers(), force=True,
                                      command=command_line())
    click.echo(format_sweep(summary))
    click.echo("what routers are told: " + ", ".join(f"{k} {v['policy']}" for k, v in summary["policies"].items()))
    fcells = [Cell(DEMO_SWEEP_RATES[-1], "sfs-soft", d, seed=seed) for d in DEMO_DELTAS]
    fdf, fsum = run_and_write_sweep(root / "frontier", spec, fcells, default_workers(), force=True,
                                    command=command_line())
    click.echo(f"sfs-soft at {DEMO_SWEEP_RATES[-1]:g} q/s, delta -> (mean utility, mean TTFT): " + ", ".join(
        f"{p['delta_per_us']:g} -> ({p['mean_utility']:.3f}, {p['ttft_mean_s']:.3f} s)" for p in fsum["frontier"]))

    click.echo(f"\n[6/6] replaying the main routers at {DEMO_SWEEP_RATES[-1]:g} q/s for their TTFT distributions, "
               f"then writing the report")
    wl8 = generate_workload(WorkloadConfig(requests=DEMO_SWEEP_REQUESTS, arrivals=ArrivalSpec("poisson",
                                                                                             DEMO_SWEEP_RATES[-1]),
                                           seed=seed))
    replay_dirs = []
    for router in MAIN_ROUTERS:
        rres = replay(pool, DEMO_POOL, wl8.requests, wl8.quality,
                      ReplayConfig(router=router, delta_per_us=DEMO_DELTA if router_entry(router).uses_delta else 0.0,
                                   seed=seed))
        write_replay_result(root / "replays" / router, rres, pool, wl8.quality, router, seed, force=True,
                            command=command_line())
        replay_dirs.append(root / "replays" / router)
        m = rres.metrics
        click.echo(f"  {router:<17} OnTimeUtility {m['ontime_utility']:.3f}  SLO attainment "
                   f"{100 * m['slo_attainment']:5.1f}%  TTFT mean {m['ttft_mean_s']:.3f} s  p90 {m['ttft_p90_s']:.3f} s")
    with StagedDir(root / "report", force=True) as tmp:
        info = build_report([load_result(p) for p in [root / "estimates", root / "sweep", root / "frontier",
                                                       *replay_dirs]], tmp, router_order=ROUTERS)
    click.echo(f"report with {len(info['figures'])} figures: {(out / 'report' / 'index.html').resolve()}"
               + (f"\ninteractive (hover, zoom, toggle): {(out / 'report' / 'interactive.html').resolve()}"
                  if info.get("interactive") else ""))
