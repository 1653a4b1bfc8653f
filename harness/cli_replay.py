"""``latroute replay`` and ``latroute sweep``: compare routers on the twin."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from harness.pools import load_pool
from harness.replay import ReplayConfig
from harness.replay import replay as run_replay
from harness.sweep import Cell, SweepSpec, default_workers, sweep_result, write_sweep_result
from routers.registry import MAIN_ROUTERS, ROUTERS
from routers.utility import DEFAULT_LAMBDA
from traces.arrivals import ARRIVAL_KINDS, ArrivalSpec
from traces.store import StagedDir, TraceWriter, open_trace, write_json
from traces.workload import WorkloadConfig, generate_workload


def _floats(text: str, name: str) -> list[float]:
    try:
        vals = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(f"not a comma-separated list of numbers: {text!r}", param_hint=name) from None
    if not vals:
        raise click.BadParameter("empty list", param_hint=name)
    return vals


def _routers(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in ROUTERS]
    if bad or not names:
        raise click.BadParameter(f"unknown router {bad[0] if bad else '(none)'} (choose from {', '.join(ROUTERS)})",
                                 param_hint="--router(s)")
    return names


def write_replay_result(out: Path, res, pool, quality, router_name: str, seed: int, record_steps: bool = False,
                        force: bool = False) -> None:
    """A replay result directory: metrics.json and the served trace."""
    from harness.twin import write_twin_trace

    with StagedDir(out, force) as tmp:
        write_json(tmp / "metrics.json", res.metrics)
        with TraceWriter(tmp / "served") as w:
            w.meta["source"] = {"kind": "replay", "pool": pool.name, "router": router_name, "seed": seed}
            w.meta["arrivals"] = "measured"
            w.meta["frontend_overhead_s"] = pool.frontend_overhead_s
            write_twin_trace(w, res.twin, requests=res.requests, steps=record_steps)
            if quality is not None:
                w.write_table("quality", quality)


def _print_replay(m: dict) -> None:
    click.echo(f"router {m['router']}: OnTimeUtility {m['ontime_utility']:.4f}, SLO attainment "
               f"{100 * m['slo_attainment']:.1f}%, mean utility {m['mean_utility']:.4f}")
    click.echo(f"TTFT mean {m['ttft_mean_s']:.3f} s, p50 {m['ttft_p50_s']:.3f}, p90 {m['ttft_p90_s']:.3f}, "
               f"p99 {m['ttft_p99_s']:.3f}; unserved {m['unserved']}")
    click.echo("share by instance: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in m["share_by_instance"].items()))
    click.echo(f"router decision {m['mean_decision_us']:.1f} us; {m['simulated_s']:,.0f} simulated s in "
               f"{m['wall_s']:.2f} s ({m['speedup']:,.0f}x real time; warm-up {m['warmup_s']:.2f} s apart)")


@click.command()
@click.option("--pool", "pool_ref", default="qwen3-h100", show_default=True, help="Pool name or POOL.json.")
@click.option("--trace", "trace_dir", type=click.Path(path_type=Path), help="Workload trace (requests [+ quality]).")
@click.option("--rate", type=float, help="Generate a workload at this rate (q/s) instead of --trace.")
@click.option("--requests", "n_requests", type=int, default=16000, show_default=True)
@click.option("--arrival", type=click.Choice(ARRIVAL_KINDS), default="poisson", show_default=True)
@click.option("--burst-ratio", type=float, default=3.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the workload and of the twin's noise.")
@click.option("--router", "router_name", default="sfs-hard", show_default=True,
              help=f"One of: {', '.join(ROUTERS)}.")
@click.option("--lambda", "lam", type=float, default=DEFAULT_LAMBDA, show_default=True,
              help="Cost weight in U = acc - lambda * cost (cost in micro-dollars).")
@click.option("--delta", type=float, default=0.0, show_default=True,
              help="Soft rule: utility per microsecond of estimated TTFT.")
@click.option("--noise", type=click.Choice(["on", "off"]), default="on", show_default=True)
@click.option("--record-steps", is_flag=True, help="Also write steps and step_items (large).")
@click.option("--out", required=True, type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def replay(pool_ref, trace_dir, rate, n_requests, arrival, burst_ratio, seed, router_name, lam, delta, noise,
           record_steps, out, force) -> None:
    """Replay a workload through one router on the engine twin of a pool.

    Writes the served trace (requests with instance, TTFT, realised utility,
    on-time flag) and metrics.json (OnTimeUtility, SLO attainment, TTFT
    percentiles, share per instance and task, router decision µs).

    \b
    Examples:
      latroute replay --rate 8 --router sfs-hard --out r-sfs
      latroute replay --trace wl --router shortest-queue --out r-sq
      latroute replay --rate 8 --router sfs-soft --delta 1e-6 --out r-soft
    """
    _routers(router_name)
    if (trace_dir is None) == (rate is None):
        raise click.UsageError("give --trace DIR or --rate R (exactly one)")
    pool = load_pool(pool_ref)
    hash_block = None
    if trace_dir is not None:
        t = open_trace(trace_dir)
        requests = t.read("requests")
        quality = t.read("quality") if t.has("quality") else None
        hash_block = t.meta.get("hash_block_tokens")
    else:
        wl = generate_workload(WorkloadConfig(requests=n_requests, arrivals=ArrivalSpec(arrival, rate, burst_ratio),
                                              seed=seed))
        requests, quality = wl.requests, wl.quality
    keep = [c for c in ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "task", "slo_ttft_s",
                        "predicted_output_tokens", "hash_ids") if c in requests]
    res = run_replay(pool, pool_ref, requests[keep], quality,
                     ReplayConfig(router=router_name, lam=lam, delta_per_us=delta, seed=seed, noise=noise == "on",
                                  record_steps=record_steps, hash_block_tokens=hash_block))
    m = res.metrics
    m.update({"pool": pool.name, "workload": str(trace_dir) if trace_dir else
              {"rate": rate, "requests": n_requests, "arrival": arrival, "burst_ratio": burst_ratio}})
    write_replay_result(out, res, pool, quality, router_name, seed, record_steps, force)
    _print_replay(m)
    click.echo(f"wrote {out}")


@click.command()
@click.option("--pool", "pool_ref", default="qwen3-h100", show_default=True)
@click.option("--rates", default="3,4,5,6,7,8,9", show_default=True, help="Arrival rates (q/s).")
@click.option("--routers", "router_names", default=",".join(MAIN_ROUTERS), show_default=True)
@click.option("--deltas", default="1e-6", show_default=True,
              help="Deltas for *-soft routers (utility per µs of estimated TTFT; 0 = latency-agnostic).")
@click.option("--lambdas", default=str(DEFAULT_LAMBDA), show_default=True)
@click.option("--arrival", type=click.Choice(["poisson", "mmpp", "gamma"]), default="poisson", show_default=True)
@click.option("--burst-ratio", type=float, default=3.0, show_default=True)
@click.option("--requests", "n_requests", type=int, default=16000, show_default=True, help="Requests per cell.")
@click.option("--seeds", type=int, default=1, show_default=True, help="Repetitions (seeds 0..K-1).")
@click.option("--workers", type=int, default=default_workers(), show_default=True, help="Worker processes.")
@click.option("--noise", type=click.Choice(["on", "off"]), default="on", show_default=True)
@click.option("--out", required=True, type=click.Path(path_type=Path))
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def sweep(pool_ref, rates, router_names, deltas, lambdas, arrival, burst_ratio, n_requests, seeds, workers, noise,
          out, force) -> None:
    """Replay routers over arrival rates (and deltas, lambdas, seeds).

    Writes results.parquet (one row per cell) and metrics.json: per router
    the OnTimeUtility AUC over the rates (trapezoid), its ratio to the best
    baseline (round-robin, shortest-queue, latency-agnostic), and with
    several --deltas the utility vs mean-TTFT frontier.

    \b
    Examples:
      latroute sweep --out sweep-poisson
      latroute sweep --rates 6,7,8 --arrival mmpp --burst-ratio 6 --out sweep-mmpp6
      latroute sweep --rates 8 --routers sfs-soft --deltas 0,1e-7,1e-6,1e-5,1e-4,1e-3,1e9 --out frontier
    """
    rate_list, delta_list, lam_list = _floats(rates, "--rates"), _floats(deltas, "--deltas"), _floats(lambdas, "--lambdas")
    names = _routers(router_names)
    if seeds < 1 or workers < 1 or n_requests < 1:
        raise click.UsageError("--seeds, --workers and --requests must be >= 1")
    cells = [Cell(r, name, d if name.endswith("-soft") else 0.0, lam, s)
             for s in range(seeds) for lam in lam_list for name in names
             for d in (delta_list if name.endswith("-soft") else [0.0]) for r in rate_list]
    spec = SweepSpec(pool=pool_ref, requests=n_requests, arrival=arrival, burst_ratio=burst_ratio,
                     noise=noise == "on")
    load_pool(pool_ref)  # refuse a bad pool before starting workers
    t = time.perf_counter()
    if sys.stderr.isatty():
        with click.progressbar(length=len(cells), label=f"{len(cells)} cells", file=sys.stderr) as bar:
            df, summary = sweep_result(spec, cells, workers, progress=bar.update)
    else:
        df, summary = sweep_result(spec, cells, workers)
    summary["wall_s"] = time.perf_counter() - t
    write_sweep_result(out, df, summary, force)
    click.echo(format_sweep(summary))
    click.echo(f"wrote {out}")


def format_sweep(s: dict) -> str:
    lines = [f"{s['cells']} cells, rates {s['rate_range'][0]:g}-{s['rate_range'][1]:g} q/s ({s['arrival']}), "
             f"{s['requests']} requests per cell"]
    rates = [f"{r:g}" for r in s["rates"]]
    lines.append(f"{'router':<28} {'AUC':>8} {'vs best':>8}  " + " ".join(f"{r:>7}" for r in rates))
    for key, v in s["routers"].items():
        ratio = v.get("auc_ratio_to_best_baseline")
        lines.append(f"{key:<28} {v['auc_ontime_utility']:8.4f} {ratio if ratio is None else f'{ratio:8.3f}'}  "
                     + " ".join(f"{v['by_rate'][r]['ontime_utility']:7.4f}" for r in rates))
    if "best_baseline" in s:
        lines.append(f"best baseline: {s['best_baseline']['router']} (OnTimeUtility AUC "
                     f"{s['best_baseline']['auc_ontime_utility']:.4f})")
    return "\n".join(lines)

