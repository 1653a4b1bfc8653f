"""``latroute replay``: one workload through one router on the twin of a pool."""
from __future__ import annotations

from pathlib import Path

import click

from harness.cli.choices import DEFAULT_LAMBDA, ROUTERS
from harness.cli.params import (
    COUNT,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
)
from harness.cli.plugin_options import isolation_options, plugin_timeout
from harness.cli.replay_options import (
    arrival_kind,
    arrival_options,
    check_lengths_option,
    check_quality_option,
    echo_policies,
    learned_options,
    parse_routers,
    policy_options,
    ties_option,
    view_options,
)
from harness.cli.serving_options import parse_serving, served_serving_metrics, serving_options
from traces.errors import BadOption

# The twin, the router registry and the trace store load numba, numpy, pandas and duckdb: imported where a
# replay runs, so that ``latroute replay --help`` does not pay for them.

def write_replay_result(out: Path, res, pool, quality, router_name: str, seed: int, record_steps: bool = False,
                        force: bool = False, command: str | None = None, percentiles=None,
                        goodput: dict | None = None) -> None:
    """A replay result directory: metrics.json (with vLLM-style serving
    metrics), metrics.parquet (the same, long format) and the served trace
    (with the quality table the replay used)."""
    from harness.twin.simulation import write_twin_trace
    from reports.results import result_header
    from reports.serving import DEFAULT_PERCENTILES, tidy
    from traces.files.outputs import StagedDir, write_json, write_parquet
    from traces.store import TraceWriter

    quality = res.extra.get("quality", quality)
    with StagedDir(out, force) as tmp:
        with TraceWriter(tmp / "served") as w:
            w.meta["source"] = {"kind": "replay", "pool": pool.name, "router": router_name, "seed": seed}
            w.meta["arrivals"] = "measured"
            w.meta["frontend_overhead_s"] = pool.frontend_overhead_s
            write_twin_trace(w, res.twin, requests=res.requests, steps=record_steps)
            if quality is not None:
                w.write_table("quality", quality)
        serving = served_serving_metrics(tmp / "served", res.requests, percentiles or DEFAULT_PERCENTILES, goodput)
        res.metrics["serving"] = serving
        write_json(tmp / "metrics.json", {**result_header("replay", command), **res.metrics})
        write_parquet(tmp / "metrics.parquet", tidy(serving, router=router_name, seed=seed))


def format_shares(shares: dict[str, float]) -> str:
    """Each instance's share of the requests; replicas (``<id>-r0`` ... ``<id>-r{N-1}``,
    ``harness.twin.pools.spec.replica_id``) as one entry with their total and range,
    so that 384 instances are three entries, not a screenful."""
    groups: dict[str, list[float]] = {}
    for k, v in shares.items():
        base, sep, tail = k.rpartition("-r")
        groups.setdefault(base if sep and tail.isdigit() else k, []).append(v)
    parts = []
    for k, v in shares.items():
        base, sep, tail = k.rpartition("-r")
        g = groups.get(base) if sep and tail.isdigit() else None
        if g is None or len(g) < 2:
            parts.append(f"{k} {100 * v:.1f}%")
        elif tail == "0":
            parts.append(f"{base}-r0..r{len(g) - 1} {100 * sum(g):.1f}% ({len(g)} replicas, "
                         f"{100 * min(g):.1f}-{100 * max(g):.1f}% each)")
    return ", ".join(parts)


def _print_replay(m: dict) -> None:
    if m["policies"]["lengths"]["oracle"]:
        click.echo("ORACLE LENGTHS: the router saw true output lengths")
    if m["policies"]["quality"]["policy"] == "none":  # every accuracy 1: OnTimeUtility is on-time share less cost
        from reports.serving import slo_goodput

        good = slo_goodput(round(m["slo_attainment"] * m["requests"]), m["serving"]["duration_s"])
        click.echo(f"router {m['router']}: SLO attainment {100 * m['slo_attainment']:.1f}%, SLO goodput "
                   f"{good:.2f} req/s; OnTimeUtility {m['ontime_utility']:.4f} (accuracy 1 everywhere: "
                   f"on-time share less lambda * cost), mean cost {m['mean_cost_micro_usd']:.1f} micro-USD")
    else:
        click.echo(f"router {m['router']}: OnTimeUtility {m['ontime_utility']:.4f}, SLO attainment "
                   f"{100 * m['slo_attainment']:.1f}%, mean utility {m['mean_utility']:.4f}")
    click.echo(f"TTFT mean {m['ttft_mean_s']:.3f} s, p50 {m['ttft_p50_s']:.3f}, p90 {m['ttft_p90_s']:.3f}, "
               f"p99 {m['ttft_p99_s']:.3f}; unserved {m['unserved']}")
    if "shed" in m:  # a router that sheds (its registry entry says so): shed requests are unserved SLO misses
        click.echo(f"shed {m['shed']:,} of {m['requests']:,} requests ({100 * m['shed_share']:.1f}%): utility 0, "
                   f"SLO missed")
    click.echo("share by instance: " + format_shares(m["share_by_instance"]))
    from reports.serving import format_serving

    click.echo(format_serving(m["serving"]))
    click.echo(f"router decision {m['mean_decision_us']:.1f} us; {m['simulated_s']:,.0f} simulated s in "
               f"{m['wall_s']:.2f} s ({m['speedup']:,.0f}x real time; warm-up {m['warmup_s']:.2f} s apart)")


@click.command()
@click.option("--pool", "pool_ref", default="qwen3-h100", show_default=True, help="Pool name or POOL.json.")
@click.option("--trace", "trace_dir", type=click.Path(path_type=Path), help="Workload trace (requests [+ quality]).")
@click.option("--rate", type=POSITIVE, help="Generate a workload at this rate (q/s) instead of --trace.")
@click.option("--requests", "n_requests", type=COUNT,
              help="Requests to generate (default 16000), or the first N of --trace (default all).")
@arrival_options
@click.option("--seed", type=SEED, default=0, show_default=True,
              help="Seed of the workload, the twin's noise and the SLO rule / quality model draws.")
@click.option("--router", "router_name", default="sfs-hard", show_default=True,
              help=f"One of: {', '.join(ROUTERS)} (latroute list routers), or a plug-in as module:Class.")
@click.option("--lambda", "lam", type=NON_NEGATIVE, default=DEFAULT_LAMBDA, show_default=True,
              help="Cost weight in U = acc - lambda * cost (cost in micro-dollars).")
@click.option("--delta", type=NON_NEGATIVE, default=0.0, show_default=True,
              help="Soft rule: utility per microsecond of estimated TTFT.")
@policy_options
@click.option("--online-speed", type=click.Choice(["on", "off"]), default="off", show_default=True,
              help="Latency-aware routers' estimators learn each instance's host speed from its completed steps "
                   "(half-life 100 steps) and scale their profile by it.")
@click.option("--noise", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="Step-time noise of the twin (the profiles' jitter and stalls); off: expected step times.")
@click.option("--record-steps", is_flag=True, help="Also write steps and step_items (large; gives ITL).")
@serving_options
@view_options
@ties_option
@learned_options
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Result directory: metrics.json, metrics.parquet and the served trace.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@isolation_options
def replay(pool_ref, trace_dir, rate, n_requests, arrival, burst_ratio, burstiness, seed, router_name, lam, delta,
           lengths_policy, slo_policy, quality_policy, online_speed, noise, record_steps, percentiles_text, goodput_text,
           epsilon, view_interval_ms, ledger, ties, retrain_every_s, window, out,
           force, isolate_plugins, plugin_timeout_s) -> None:
    """Replay a workload through one router on the engine twin of a pool.

    Writes the served trace (requests with instance, TTFT, SLO, realised
    utility, on-time flag) and metrics.json (OnTimeUtility, SLO
    attainment, TTFT percentiles, share per instance and task, router
    decision µs, and the length, SLO and quality policies used). Where a
    trace lacks predicted lengths, SLOs or accuracies (imported production
    traces do), the default policy fills them and says so.

    \b
    Examples:
      latroute replay --rate 8 --router sfs-hard --out r-sfs
      latroute replay --trace wl --router shortest-queue --out r-sq
      latroute replay --rate 8 --router sfs-soft --delta 1e-6 --out r-soft
      latroute replay --rate 8 --burstiness 0.25 --router sfs-hard --out r-bursty   # gamma, CV^2 = 4
      latroute replay --trace azconv --requests 4000 --router sfs-hard --out r-az   # SLO rule, quality model
      latroute replay --rate 8 --router sfs-cc --epsilon 0.1 --view-interval 100 --ledger on --out r-stale
      latroute replay --rate 8 --router oracle --out r-oracle   # clairvoyant reference (forks the twin)
      latroute replay --pool qwen3-h100-x8 --rate 48 --router sfs-cc --ties least-latency --out r-x8
      latroute replay --pool my-pool.json --rate 4 --router sfs-hard --slo constant:500 --quality acc.csv --out r-mine
    """
    from traces.files.outputs import check_out

    check_out(out, force, inputs=[trace_dir, pool_ref])  # before any work
    isolate_s = plugin_timeout(isolate_plugins, plugin_timeout_s)
    from harness.twin.pools.spec import load_pool
    from harness.twin.replay import ReplayConfig, workload_inputs
    from harness.twin.replay import replay as run_replay
    from harness.twin.simulation import InstanceSpec
    from reports.results import command_line
    from routers.registry import router_entry
    from traces.store import open_trace
    from traces.workload.arrivals import ArrivalSpec
    from traces.workload.generator import WorkloadConfig, generate_workload

    names = parse_routers(router_name)
    if len(names) != 1:
        raise BadOption("--router", f"takes one router, got {len(names)} ({', '.join(names)}); to compare "
                                    f"routers, latroute sweep --routers {','.join(names)}")
    percentiles, goodput = parse_serving(percentiles_text, goodput_text)
    if delta != 0.0 and not router_entry(router_name).uses_delta:
        raise BadOption("--delta", f"{router_name} does not use a delta (routers that do: "
                                   f"{', '.join(n for n in ROUTERS if router_entry(n).uses_delta)})")
    if (trace_dir is None) == (rate is None):
        raise click.UsageError("give --trace DIR or --rate R (exactly one)")
    check_lengths_option(lengths_policy)
    if trace_dir is not None and (arrival is not None or burstiness != 1.0):
        raise BadOption("--arrival" if arrival is not None else "--burstiness",
                        "applies to generated workloads (--rate), not to --trace")
    kind = arrival_kind(arrival, burstiness)
    pool = load_pool(pool_ref)
    check_quality_option(quality_policy, [c.model for c in pool.instances])
    hash_block = None
    if trace_dir is not None:
        from traces.workload.arrivals import check_replay_arrivals

        t = open_trace(trace_dir)
        requests = t.read("requests")
        if n_requests is not None:
            requests = requests.iloc[:n_requests].reset_index(drop=True)
        check_replay_arrivals(t, requests)
        quality = t.read("quality") if t.has("quality") else None
        hash_block = t.meta.get("hash_block_tokens")
    else:
        n_requests = 16000 if n_requests is None else n_requests
        wl = generate_workload(WorkloadConfig(requests=n_requests, arrivals=ArrivalSpec(
            kind, rate, burst_ratio, burstiness=burstiness), seed=seed))
        requests, quality = wl.requests, wl.quality
        del wl
    keep = [c for c in ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "task", "slo_ttft_s",
                        "predicted_output_tokens", "hash_ids") if c in requests]
    # one table of the columns kept, taken once (an hour at 1,024 q/s is 3.7M rows: each copy ~0.3 GB)
    requests = requests if list(requests.columns) == keep else requests[keep]
    cfg = ReplayConfig(router=router_name, lam=lam, delta_per_us=delta, seed=seed, noise=noise == "on",
                       record_steps=record_steps, lengths=lengths_policy, slo=slo_policy, quality=quality_policy,
                       online_speed=online_speed == "on", epsilon=epsilon, view_interval_ms=view_interval_ms,
                       ledger=ledger == "on", hash_block_tokens=hash_block, ties=ties,
                       retrain_every_s=retrain_every_s, window=window, plugin_timeout_s=isolate_s)
    try:
        inputs = workload_inputs(requests, quality, [InstanceSpec.from_config(c) for c in pool.instances], cfg)
    except ValueError as e:
        raise BadOption("--lengths/--slo/--quality", f"{trace_dir or 'workload'}: {e}") from None
    echo_policies(inputs)
    res = run_replay(pool, pool_ref, requests, quality, cfg, inputs)
    m = res.metrics
    m.update({"pool": pool.name, "workload": str(trace_dir) if trace_dir else
              {"rate": rate, "requests": n_requests, "arrival": kind, "burst_ratio": burst_ratio,
               "burstiness": burstiness}})
    write_replay_result(out, res, pool, quality, router_name, seed, record_steps, force, command_line(),
                        percentiles, goodput)
    _print_replay(m)
    click.echo(f"wrote {out}")
