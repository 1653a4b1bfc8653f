"""``latroute bench``: the project's speed and memory figures.

Speed is measured here, never in unit tests. Each section runs its work in
a child process where memory matters, so the peak resident set size it
reports belongs to that work alone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from harness.cli.params import COUNT, POSITIVE

SECTIONS = ("generate", "import", "twin", "replay", "routers", "sfs", "sfs-cache", "fleet")


SECTIONS_AGAINST = ("twin", "replay", "sfs", "fleet")  # the sections ``--against`` benches on both checkouts


def _checkout_env(checkout: Path | None) -> dict | None:
    """The environment of a child that runs ``checkout``'s code (``None``: this one's)."""
    return None if checkout is None else dict(os.environ, PYTHONPATH=str(checkout.resolve()))


def _run_measured(module: str, *args: str, checkout: Path | None = None) -> tuple[subprocess.CompletedProcess, float,
                                                                                   float]:
    """Run ``python -m MODULE ARGS`` in a child under ``harness.bench.peak_mem``
    (with ``checkout``'s code if given); return (the finished process, wall
    seconds, its own peak RSS in MB)."""
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "harness.bench.peak_mem", module, *args], capture_output=True, text=True,
                          env=_checkout_env(checkout))
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise click.ClickException(f"{module} {' '.join(args)} failed:\n{proc.stderr.strip()}")
    return proc, wall, _peak_from(proc.stderr)


def _peak_from(stderr: str) -> float:
    from harness.bench.peak_mem import MARKER

    for line in reversed(stderr.splitlines()):
        if line.startswith(MARKER):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def bench_generate(requests: int, workdir: Path) -> dict:
    from traces.workload.arrivals import ArrivalSpec
    from traces.workload.generator import WorkloadConfig, write_workload

    t = time.perf_counter()
    write_workload(WorkloadConfig(requests=requests, arrivals=ArrivalSpec("poisson", 8.0), seed=0),
                   workdir / "generated", force=True)
    wall = time.perf_counter() - t
    return {"requests": requests, "wall_s": wall, "requests_per_s": requests / wall}


def bench_import(rows: int, workdir: Path) -> dict:
    from traces.workload.synth_azure import write_azure_csv

    csv_path = workdir / "azure_synth.csv"
    t = time.perf_counter()
    write_azure_csv(csv_path, rows)
    write_s = time.perf_counter() - t
    _, wall, peak_mb = _run_measured("harness.cli", "trace", "import", "azure", str(csv_path),
                                     "--out", str(workdir / "imported"), "--force")
    size_mb = csv_path.stat().st_size / 1e6
    csv_path.unlink()
    return {"rows": rows, "csv_mb": size_mb, "csv_write_s": write_s, "import_wall_s": wall,
            "rows_per_s": rows / wall, "peak_rss_mb": peak_mb}


def bench_twin(requests: int, rate: float, router: str, checkout: Path | None = None) -> dict:
    proc, _, peak_mb = _run_measured("harness.bench.twin", str(requests), str(rate), router, checkout=checkout)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["peak_rss_mb"] = peak_mb
    return out


def bench_sfs_against(checkout: Path) -> dict:
    """The SFS section as ``checkout``'s own ``harness.bench.sfs`` measures it, in a child on its code
    (the states are built by each checkout's bench from the same seed, so the cells are the same)."""
    code = "import json; from harness.bench.sfs import run; print(json.dumps(run()))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_checkout_env(checkout))
    if proc.returncode != 0:
        raise click.ClickException(f"the sfs section on {checkout} failed:\n{proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_against(path: Path, sections) -> None:
    """``--against`` is a latroute checkout (its source tree: its cells run with ``PYTHONPATH`` on it,
    and a directory without one benched the installed latroute against itself) and a section it
    benches runs."""
    from traces.errors import BadOption

    if not set(sections) & set(SECTIONS_AGAINST):
        raise BadOption("--against", f"benches the {', '.join(SECTIONS_AGAINST)} sections only: add --only with one "
                                     "of them (or leave --only out)")
    missing = [p for p in ("harness/twin/replay.py", "harness/bench/twin.py", "routers/registry.py")
               if not (path / p).is_file()]
    if missing:
        raise BadOption("--against", f"{path} is no latroute checkout (no {missing[0]}): give the root of one, "
                                     "e.g. ../main")


@click.command()
@click.option("--only", "only", multiple=True, type=click.Choice(SECTIONS), help="Run only these sections.")
@click.option("--generate-requests", type=COUNT, default=1_000_000, show_default=True,
              help="Requests in the generate-and-write benchmark.")
@click.option("--import-rows", type=COUNT, default=10_000_000, show_default=True,
              help="Rows of the synthetic Azure-format CSV to import.")
@click.option("--twin-requests", type=COUNT, default=16_000, show_default=True,
              help="Requests replayed on pool qwen3-h100 (the paper uses 16,000 per rate).")
@click.option("--twin-rate", type=POSITIVE, default=8.0, show_default=True, help="Arrival rate of the twin replay (q/s).")
@click.option("--fleet-sizes", type=click.Choice(["3", "24", "96", "384"]), multiple=True,
              help="Fleet section: pool sizes (default 3, 24, 96 and 384 instances).")
@click.option("--fleet-seconds", type=POSITIVE, default=15.0, show_default=True,
              help="Fleet section: simulated seconds of arrivals per cell, at least (small pools run to 2,000 "
                   "instance-seconds).")
@click.option("--against", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Also bench this checkout (e.g. main) in the same run: the twin, replay, sfs and fleet "
                   "sections on the same cells, and report the ratios.")
@click.option("--workdir", type=click.Path(path_type=Path), help="Scratch directory (default: a temp dir).")
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
def bench(only: tuple[str, ...], generate_requests: int, import_rows: int, twin_requests: int, twin_rate: float,
          fleet_sizes: tuple[str, ...], fleet_seconds: float, against: Path | None, workdir: Path | None,
          as_json: bool) -> None:
    """Measure speed and memory of latroute's heavy paths.

    \b
    Sections:
      generate  generate and write an N-request workload trace
      import    write an N-row Azure-format CSV, import it in a child
                process and report its peak memory (target < 2 GB at 10M rows)
      twin      replay pool qwen3-h100 at 8 q/s with shortest-queue in a child
                process: simulated seconds per wall second (target >= 1000x),
                compile (warm-up) time apart, peak memory
      replay    the same replay routed by sfs-hard (target >= 1000x), router decision us
      routers   every built-in router on one workload (4,000 requests at 8 q/s on
                qwen3-h100): mean decision us and replay speed, compile apart; then
                shortest-queue, sfs-cc and sfs-hard on 3, 24, 96 and 384 instances
                (ties random, the default; lowest-index and least-latency too up to 96):
                decision us by size
      sfs       SFS cost per estimate with 16/64/256/1024 residents and a short
                queue (target: median <= 10 us at 64), and cost per simulated step;
                the probabilistic estimate's cost at 64 (target <= 2x the point
                estimate) and its accuracy against a brute-force Monte Carlo
      sfs-cache SFS with prefix caching on a warm qwen3-h100 instance (qwen3-0.6b alone
                serving the session workload at 8 q/s, first arrival after 10
                simulated minutes with >= 64 residents) against the same state with
                caching off (target: within 1.5x), and the twin's speed on that
                workload over the pool (target >= 1000x)
      fleet     the twin on 3, 24, 96 and 384 instances (qwen3-h100 and its replica
                pools) at 8 q/s per three instances, shortest-queue and sfs-cc:
                simulated instance-seconds per wall second (target at 384 >= 0.8x
                that at 3), decision us, peak memory, warm-up apart; the memory
                of an hour at 384 instances estimated (target 4 GB)

    With --against PATH, the twin, replay, sfs and fleet sections also run
    on that checkout's code in the same run, and the ratios are printed.

    \b
    Examples:
      latroute bench
      latroute bench --only import --import-rows 10000000 --json
      latroute bench --only twin --twin-requests 200000
      latroute bench --only fleet --against ../main
      latroute bench --only twin --only sfs --only fleet --against ../main
    """
    sections = only or SECTIONS
    if against is not None:
        check_against(against, sections)
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="latroute-bench-", dir=workdir) as tmp:
        tmp_path = Path(tmp)
        if "generate" in sections:
            results["generate"] = r = bench_generate(generate_requests, tmp_path)
            if not as_json:
                click.echo(f"generate: {r['requests']:,} requests generated and written in {r['wall_s']:.2f} s "
                           f"({r['requests_per_s']:,.0f} requests/s)")
        if "import" in sections:
            results["import"] = r = bench_import(import_rows, tmp_path)
            if not as_json:
                click.echo(f"import:   {r['rows']:,}-row Azure CSV ({r['csv_mb']:.0f} MB) imported in "
                           f"{r['import_wall_s']:.1f} s ({r['rows_per_s']:,.0f} rows/s), "
                           f"peak memory {r['peak_rss_mb']:.0f} MB")
        for section, router in (("twin", "shortest-queue"), ("replay", "sfs-hard")):
            if section not in sections:
                continue
            results[section] = r = bench_twin(twin_requests, twin_rate, router)
            runs = [("", r)]
            if against is not None:
                r["against"] = a = bench_twin(twin_requests, twin_rate, router, checkout=against)
                r["speedup_vs_against"] = r["speedup"] / a["speedup"]
                r["warmup_vs_against"] = r["warmup_s"] / a["warmup_s"]
                runs.append(("against ", a))
            if not as_json:
                for label, x in runs:
                    click.echo(f"{section + ':':<9} {label}{x['requests']:,} requests at {x['rate']:g} q/s on "
                               f"{x['pool']} ({x['router']}): {x['simulated_s']:,.0f} simulated s in "
                               f"{x['wall_s']:.2f} s = {x['speedup']:,.0f}x real time, {x['steps_per_s']:,.0f} "
                               f"steps/s; router decision {x['mean_decision_us']:.1f} us; warm-up (compile or cache "
                               f"load) {x['warmup_s']:.2f} s apart; peak memory {x['peak_rss_mb']:.0f} MB")
                if against is not None:
                    click.echo(f"          speed vs --against {r['speedup_vs_against']:.2f}x, warm-up "
                               f"{r['warmup_vs_against']:.2f}x")
        if "routers" in sections:
            from harness.bench.routers import run as run_routers

            results["routers"] = r = run_routers()
            if not as_json:
                click.echo(f"routers:  {r['requests']:,} requests at {r['rate']:g} q/s on {r['pool']}, mean decision "
                           f"time per router (soft rules at delta {r['soft_delta_per_us']:g}/us; compile apart; setup "
                           f"{r['setup_s']:.1f} s):")
                for name, v in sorted(r["routers"].items(), key=lambda kv: kv[1]["mean_decision_us"]):
                    click.echo(f"          {name:<18} {v['mean_decision_us']:9.1f} us   replay {v['speedup']:,.0f}x "
                               f"real time   OnTimeUtility {v['ontime_utility']:.4f}")
            from harness.bench.routers import fleet_sizes

            r["fleet"] = f = fleet_sizes()
            if not as_json:
                click.echo(f"          decision us by pool size ({f['rate_per_instance']:.3g} q/s per instance, "
                           f"{f['simulated_s']:g} simulated s; targets at 96: shortest-queue <= 3, sfs-cc <= 30):")
                for n, v in f["sizes"].items():
                    for name, c in v["routers"].items():
                        click.echo(f"          {n:>4} instances  {name:<30} {c['mean_decision_us']:9.1f} us   "
                                   f"OnTimeUtility {c['ontime_utility']:.4f}")
        if "sfs" in sections:
            from harness.bench.sfs import run as run_sfs

            results["sfs"] = r = run_sfs()
            if against is not None:
                r["against"] = a = bench_sfs_against(against)
                r["median_vs_against"] = {n: v["median_us"] / a["sizes"][n]["median_us"]
                                          for n, v in r["sizes"].items() if n in a["sizes"]}
            if not as_json:
                click.echo(f"sfs:      {r['engine']}, {r['waiting']} waiting, {r['queries']} queries per size")
                for n, v in r["sizes"].items():
                    vs = (f"; {r['median_vs_against'][n]:.2f}x the median of --against "
                          f"({r['against']['sizes'][n]['median_us']:.1f} us)" if n in r.get("median_vs_against", {})
                          else "")
                    click.echo(f"          {int(n):>5} residents: median {v['median_us']:6.1f} us, p99 "
                               f"{v['p99_us']:6.1f} us, {v['mean_steps']:.1f} simulated steps, "
                               f"{v['us_per_step']:.1f} us/step (first call {v['warmup_us']:,.0f} us, apart){vs}")
                lin = r["linearity"]
                click.echo("          64 residents, longer queues: " + ", ".join(
                    f"{p['steps']:.0f} steps {p['median_us']:.0f} us" for p in lin["points"])
                           + f" -> {lin['us_per_step']:.1f} us per simulated step (linear fit R^2 {lin['r2']:.3f})")
            from harness.bench.sfs_dist import run as run_dist

            results["sfs_dist"] = r = run_dist()
            if not as_json:
                c = r["cost_64"]
                click.echo(f"sfs-dist: 64 residents, same run: point {c['point_median_us']:.1f} us, probabilistic "
                           f"(mean, p50/p90/p99, P(on time)) {c['dist_median_us']:.1f} us = {c['ratio']:.2f}x "
                           f"(target <= 2x); with the quantiles recalibrated online {c['recalibrated_median_us']:.1f} "
                           f"us = {c['recalibrated_ratio']:.2f}x")
                for label, a in r["accuracy"].items():
                    sh = a["mc_share_below"]
                    click.echo(f"          vs brute-force Monte Carlo ({a['cases']} trajectories x {a['draws']} "
                               f"twin-noise draws), {label}: share below p50/p90/p99 {sh['p50']:.3f}/"
                               f"{sh['p90']:.3f}/{sh['p99']:.3f}, max |P(on time) error| "
                               f"{a['max_abs_p_on_time_error']:.3f}")
        if "sfs-cache" in sections:
            from harness.bench.sfs_cache import run as run_sfs_cache

            results["sfs-cache"] = r = run_sfs_cache()
            if not as_json:
                if "median_us_on" in r:
                    click.echo(f"sfs-cache: {r['instance']} alone serving the session workload at 8 q/s, first arrival "
                               f"after 600 s with >= 64 residents: {r['t_s']:.0f} s, {r['residents']} residents, "
                               f"{r['cached_free_blocks']:,} cached free blocks: median {r['median_us_on']:.1f} us "
                               f"with the cache vs {r['median_us_off']:.1f} us without = {r['ratio']:.2f}x "
                               f"(target 1.5x; p99 {r['p99_us_on']:.0f} vs {r['p99_us_off']:.0f} us; "
                               f"{r['mean_steps_on']:.1f} vs {r['mean_steps_off']:.1f} simulated steps; "
                               f"{r['fallbacks']} fallbacks to a copy in {r['queries']} estimates)")
                else:
                    click.echo("sfs-cache: the instance never held 64 residents after 600 s")
                click.echo(f"           twin on the session workload (pool qwen3-h100, caching on, shortest-queue): "
                           f"{r['twin_speedup']:,.0f}x real time (target 1000x), prefix hit rate "
                           f"{100 * r['hit_rate']:.1f}%")
        if "fleet" in sections:
            results["fleet"] = bench_fleet(fleet_sizes, fleet_seconds, against, as_json)
    if as_json:
        click.echo(json.dumps(results, indent=2))


def bench_fleet(sizes: tuple[str, ...], seconds: float, against: Path | None, as_json: bool) -> dict:
    from harness.bench.fleet import FleetBench, run

    cfg = FleetBench(seconds=seconds, against=against)
    if sizes:
        cfg = FleetBench(sizes=tuple(sorted(int(n) for n in set(sizes))), seconds=seconds, against=against,
                         against_sizes=tuple(sorted(int(n) for n in set(sizes) if int(n) < 384)))

    def echo(c: dict) -> None:
        if not as_json:
            click.echo(f"fleet:    {c['checkout']:<7} {c['instances']:>4} instances {c['router']:<26} "
                       f"{c['requests']:>6,} requests at {c['rate']:g} q/s: {c['simulated_s']:7.1f} simulated s "
                       f"in {c['wall_s']:6.2f} s = {c['instance_s_per_s']:7,.0f} instance-s/s (twin less decisions "
                       f"{c['twin_instance_s_per_s']:7,.0f}), decision "
                       f"{c['mean_decision_us']:7.1f} us, warm-up {c['warmup_s']:.1f} s apart, peak "
                       f"{c['peak_rss_mb']:.0f} MB")

    try:
        r = run(cfg, echo)
    except RuntimeError as e:
        raise click.ClickException(str(e)) from None
    if not as_json:
        for router, v in r["summary"].items():
            for p, what in (("", "instance-s/s"), ("twin_", "twin less decisions")):
                click.echo(f"          {router}, {what}: vs the smallest pool " + ", ".join(
                    f"{n}: {x:.2f}x" for n, x in v[p + "vs_smallest"].items()) + (
                    "; vs --against " + ", ".join(f"{n}: {x:.2f}x" for n, x in v[p + "vs_against"].items())
                    if v[p + "vs_against"] else ""))
        m = r.get("memory")
        if m:
            click.echo(f"          memory: {m['per_request_kb']:.2f} KB per request "
                       f"(slope on the {m['base_instances']}-instance pool); "
                       f"{m['base_instances']} instances x {m['hour_requests']:,} requests (1 hour) ~ "
                       f"{m['hour_estimate_mb']:,.0f} MB estimated (target 4096 MB)")
    return r
