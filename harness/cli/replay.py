"""``latroute replay`` and ``latroute sweep``: compare routers on the twin."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from harness.cli.params import (
    AT_LEAST_1,
    COUNT,
    MAX_SEED,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY_BELOW_1,
    SEED,
    FloatList,
    IntIn,
    cores,
)
from harness.cli.serving_options import parse_serving, served_serving_metrics, serving_options
from harness.sweep.backends import BACKENDS, Progress
from harness.sweep.driver import (
    Cell,
    SweepSpec,
    check_sweep_run,
    default_workers,
    spec_doc,
    sweep_inputs,
    sweep_result,
    write_sweep_result,
)
from harness.sweep.store import SweepStore, cell_key
from harness.twin.pools import load_pool
from harness.twin.replay import ReplayConfig, workload_inputs
from harness.twin.replay import replay as run_replay
from harness.twin.simulation import InstanceSpec
from reports.results import command_line, result_header
from routers.chance import DEFAULT_EPSILON
from routers.registry import MAIN_ROUTERS, ROUTERS, router_entry
from routers.utility import DEFAULT_LAMBDA
from traces.arrivals import ARRIVAL_KINDS, ArrivalSpec, resolve_arrival
from traces.errors import BadInput, BadOption
from traces.lengths import LENGTH_POLICIES, check_length_policy
from traces.outputs import StagedDir, check_out, write_json, write_parquet
from traces.quality import QUALITY_POLICIES
from traces.slo import SLO_POLICIES
from traces.store import TraceWriter, open_trace
from traces.workload import WorkloadConfig, generate_workload


def _routers(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise click.BadParameter("no router given", param_hint="--router(s)")
    for n in names:  # built-in names, or plug-ins as module:Class (routers.registry.plugin_entry)
        try:
            router_entry(n)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--router(s)") from None
    return names


def policy_options(f):
    """--lengths, --slo and --quality: what routers are told where a trace
    lacks it (shared by replay and sweep)."""
    f = click.option("--quality", "quality_policy", type=click.Choice(QUALITY_POLICIES),
                     help="Per-model accuracy: the trace's quality table, or the generator's accuracy model with "
                          "the requests as one task. Default: table if the trace has one, else model.")(f)
    f = click.option("--slo", "slo_policy", type=click.Choice(SLO_POLICIES),
                     help="TTFT SLOs: the trace's slo_ttft_s, DESIGN's rule on the prompt length, or none "
                          "(every served request on time). Default: column if present, else rule.")(f)
    f = click.option("--lengths", "lengths_policy", metavar="|".join(LENGTH_POLICIES),
                     help="Predicted output lengths routers see. Default: column (predicted_output_tokens) if "
                          "present, else median (of the trace's output lengths). oracle = true lengths.")(f)
    return f


def view_options(f):
    """--epsilon, --view-interval, --ledger (replay and sweep)."""
    f = click.option("--ledger", type=click.Choice(["on", "off"]), default="on", show_default=True,
                     help="With --view-interval: requests dispatched since the last refresh join the stale view.")(f)
    f = click.option("--view-interval", "view_interval_ms", type=NON_NEGATIVE, default=0.0, show_default=True,
                     help="Routers see engine state refreshed every MS milliseconds (0: every step, live). "
                          "The oracle always forks the live twin.")(f)
    return click.option("--epsilon", type=PROBABILITY_BELOW_1, default=DEFAULT_EPSILON, show_default=True,
                        help="Chance-constrained routers (sfs-cc, throughput-cc): allowed P(TTFT > SLO), one "
                             "value for every rate. On qwen3-h100 (Poisson 3-9 q/s) sfs-cc's AUC is flat from 0.02 "
                             "to 0.3, within the seed spread; 0.1 sits in the middle of it.")(f)


def arrival_options(f):
    f = click.option("--burstiness", type=POSITIVE, default=1.0, show_default=True,
                     help="Gamma shape: inter-arrival CV^2 = 1/burstiness (vllm bench serve's meaning); other than "
                          "1 implies --arrival gamma.")(f)
    f = click.option("--burst-ratio", type=AT_LEAST_1, default=3.0, show_default=True, help="mmpp: high/low rate ratio.")(f)
    f = click.option("--arrival", type=click.Choice(ARRIVAL_KINDS),
                     help="Arrival process of generated workloads. Default: poisson, or gamma when --burstiness "
                          "is not 1.")(f)
    return f


def _arrival(arrival: str | None, burstiness: float) -> str:
    try:
        return resolve_arrival(arrival, burstiness)
    except ValueError as e:
        raise BadOption("--burstiness", str(e)) from None


def _check_lengths(text: str | None) -> None:
    try:
        check_length_policy(text)
    except ValueError as e:
        raise BadOption("--lengths", str(e)) from None


def echo_policies(inputs) -> None:
    """Say which policies filled what the trace lacks (oracle lengths
    loudly, on stderr too)."""
    for note in inputs.notes():
        click.echo(note)
    if inputs.lengths.oracle:
        click.echo(inputs.lengths.note, err=True)


def write_replay_result(out: Path, res, pool, quality, router_name: str, seed: int, record_steps: bool = False,
                        force: bool = False, command: str | None = None, percentiles=None,
                        goodput: dict | None = None) -> None:
    """A replay result directory: metrics.json (with vLLM-style serving
    metrics), metrics.parquet (the same, long format) and the served trace
    (with the quality table the replay used)."""
    from harness.twin.simulation import write_twin_trace
    from reports.serving import DEFAULT_PERCENTILES, tidy

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


def _print_replay(m: dict) -> None:
    if m["policies"]["lengths"]["oracle"]:
        click.echo("ORACLE LENGTHS: the router saw true output lengths")
    click.echo(f"router {m['router']}: OnTimeUtility {m['ontime_utility']:.4f}, SLO attainment "
               f"{100 * m['slo_attainment']:.1f}%, mean utility {m['mean_utility']:.4f}")
    click.echo(f"TTFT mean {m['ttft_mean_s']:.3f} s, p50 {m['ttft_p50_s']:.3f}, p90 {m['ttft_p90_s']:.3f}, "
               f"p99 {m['ttft_p99_s']:.3f}; unserved {m['unserved']}")
    click.echo("share by instance: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in m["share_by_instance"].items()))
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
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Result directory: metrics.json, metrics.parquet and the served trace.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def replay(pool_ref, trace_dir, rate, n_requests, arrival, burst_ratio, burstiness, seed, router_name, lam, delta,
           lengths_policy, slo_policy, quality_policy, online_speed, noise, record_steps, percentiles_text, goodput_text,
           epsilon, view_interval_ms, ledger, out,
           force) -> None:
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
    """
    check_out(out, force, inputs=[trace_dir, pool_ref])  # before any work
    _routers(router_name)
    percentiles, goodput = parse_serving(percentiles_text, goodput_text)
    if delta != 0.0 and not router_entry(router_name).uses_delta:
        raise BadOption("--delta", f"{router_name} does not use a delta (routers that do: "
                                   f"{', '.join(n for n in ROUTERS if router_entry(n).uses_delta)})")
    if (trace_dir is None) == (rate is None):
        raise click.UsageError("give --trace DIR or --rate R (exactly one)")
    _check_lengths(lengths_policy)
    if trace_dir is not None and (arrival is not None or burstiness != 1.0):
        raise BadOption("--arrival" if arrival is not None else "--burstiness",
                        "applies to generated workloads (--rate), not to --trace")
    kind = _arrival(arrival, burstiness)
    pool = load_pool(pool_ref)
    hash_block = None
    if trace_dir is not None:
        from traces.arrivals import check_replay_arrivals

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
    keep = [c for c in ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "task", "slo_ttft_s",
                        "predicted_output_tokens", "hash_ids") if c in requests]
    cfg = ReplayConfig(router=router_name, lam=lam, delta_per_us=delta, seed=seed, noise=noise == "on",
                       record_steps=record_steps, lengths=lengths_policy, slo=slo_policy, quality=quality_policy,
                       online_speed=online_speed == "on", epsilon=epsilon, view_interval_ms=view_interval_ms,
                       ledger=ledger == "on", hash_block_tokens=hash_block)
    try:
        inputs = workload_inputs(requests[keep], quality, [InstanceSpec.from_config(c) for c in pool.instances], cfg)
    except ValueError as e:
        raise BadOption("--lengths/--slo/--quality", f"{trace_dir or 'workload'}: {e}") from None
    echo_policies(inputs)
    res = run_replay(pool, pool_ref, requests[keep], quality, cfg, inputs)
    m = res.metrics
    m.update({"pool": pool.name, "workload": str(trace_dir) if trace_dir else
              {"rate": rate, "requests": n_requests, "arrival": kind, "burst_ratio": burst_ratio,
               "burstiness": burstiness}})
    write_replay_result(out, res, pool, quality, router_name, seed, record_steps, force, command_line(),
                        percentiles, goodput)
    _print_replay(m)
    click.echo(f"wrote {out}")


SWEEP_SPEC_KEYS = ("pool", "trace", "rates", "routers", "deltas", "lambdas", "arrival", "burst_ratio", "burstiness",
                   "lengths", "slo", "quality", "requests", "seeds", "seed", "workers", "metric_percentiles", "goodput", "noise", "backend", "address",
                   "online_speed", "epsilon", "view_interval", "ledger")


def _spec_file(ctx: click.Context, param, path: Path | None):
    """Fill options from a TOML sweep specification; flags given on the
    command line win."""
    if path is None:
        return None
    import tomllib

    try:
        doc = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise BadInput(path, None, "--spec", "does not exist") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise BadInput(path, None, "--spec", f"not valid TOML ({e})") from None
    sweep_doc = doc.get("sweep", doc)
    unknown = sorted(set(sweep_doc) - set(SWEEP_SPEC_KEYS))
    if unknown:
        raise BadInput(path, None, unknown[0], f"unknown key (known: {', '.join(SWEEP_SPEC_KEYS)})")
    defaults = ctx.default_map or {}
    for key, value in sweep_doc.items():
        if isinstance(value, list):
            value = ",".join(str(v) for v in value)
        name = {"routers": "router_names", "requests": "n_requests", "pool": "pool_ref", "trace": "trace_dir",
                "lengths": "lengths_policy", "slo": "slo_policy", "quality": "quality_policy",
                "seed": "first_seed", "metric_percentiles": "percentiles_text", "goodput": "goodput_text",
                "view_interval": "view_interval_ms"
                }.get(key, key)
        defaults[name] = value
    ctx.default_map = defaults
    return path


@click.command()
@click.option("--spec", "spec_path", type=click.Path(path_type=Path), callback=_spec_file, is_eager=True,
              expose_value=False, help="TOML file with the sweep's options (a [sweep] table or top-level keys named "
                                       "like the flags: rates = [3, 4, 5], routers = [...]); flags override it.")
@click.option("--pool", "pool_ref", default="qwen3-h100", show_default=True,
              help="Pool name or POOL.json (latroute list pools).")
@click.option("--trace", "trace_dir", type=click.Path(path_type=Path),
              help="Replay this trace's requests, arrival times rescaled to each rate, instead of generating.")
@click.option("--rates", type=FloatList(POSITIVE), default="3,4,5,6,7,8,9", show_default=True, help="Arrival rates (q/s).")
@click.option("--routers", "router_names", default=",".join(MAIN_ROUTERS), show_default=True,
              help=f"Comma-separated routers, of: {', '.join(ROUTERS)} (latroute list routers), or plug-ins "
                   "as module:Class.")
@click.option("--deltas", type=FloatList(NON_NEGATIVE), default="1e-6", show_default=True,
              help="Deltas for routers that use one (the soft rule: utility per µs of estimated TTFT; "
                   "0 = latency-agnostic).")
@click.option("--lambdas", type=FloatList(NON_NEGATIVE), default=str(DEFAULT_LAMBDA), show_default=True,
              help="Cost weights lambda in U = acc - lambda * cost (cost in micro-dollars), comma-separated.")
@arrival_options
@policy_options
@click.option("--requests", "n_requests", type=COUNT, default=16000, show_default=True, help="Requests per cell.")
@serving_options
@click.option("--seeds", type=IntIn(1, 10**4), default=1, show_default=True,
              help="Number of paired seeds SEED..SEED+K-1 (the same workloads and noise for every router); "
                   "K >= 2 gives 95% intervals.")
@click.option("--seed", "first_seed", type=SEED, default=0, show_default=True,
              help="First seed (as in replay and trace generate).")
@click.option("--workers", type=IntIn(1, cores()), default=default_workers(), show_default=True,
              help="Worker processes (local) or CPUs of a local Ray; at most the machine's cores.")
@click.option("--backend", type=click.Choice(BACKENDS), default="local", show_default=True,
              help="local: a process pool here; ray: each cell a Ray task (pip install 'latroute[ray]').")
@click.option("--address", help="With --backend ray: an existing cluster (e.g. 127.0.0.1:6379); default a local Ray "
                                "started for the run.")
@click.option("--online-speed", type=click.Choice(["on", "off"]), default="off", show_default=True,
              help="Latency-aware routers' estimators learn each instance's host speed from its completed steps "
                   "(half-life 100 steps) and scale their profile by it.")
@click.option("--noise", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="Step-time noise of the twin (the profiles' jitter and stalls); off: expected step times.")
@view_options
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Result directory: cells/, results.parquet, metrics.json, metrics.parquet.")
@click.option("--resume", is_flag=True, help="Continue the sweep in --out: run only the cells it lacks (the "
                                             "specification must be the same).")
@click.option("--force", is_flag=True, help="Replace --out if a latroute sweep wrote it.")
def sweep(pool_ref, trace_dir, rates, router_names, deltas, lambdas, arrival, burst_ratio, burstiness,
          lengths_policy, slo_policy, quality_policy, n_requests, percentiles_text, goodput_text, seeds, first_seed,
          workers, backend, address, online_speed, noise, epsilon, view_interval_ms, ledger, out, resume,
          force) -> None:
    """Replay routers over arrival rates (and deltas, lambdas, seeds).

    Every finished cell is written at once under --out (cells/), so Ctrl-C
    or a crash loses only the cells in flight and --resume finishes the
    sweep. When done: results.parquet (one row per cell, with the
    inter-arrival CV^2 it replayed), timings.parquet (wall time per cell)
    and metrics.json: per router the OnTimeUtility AUC over the rates
    (trapezoid) with its 95% interval over seeds, its ratio to the best
    baseline (round-robin, shortest-queue, latency-agnostic) with a paired
    interval, with several --deltas the utility vs mean-TTFT frontier, and
    the length, SLO and quality policies used.

    \b
    Examples:
      latroute sweep --out sweep-poisson
      latroute sweep --rates 6,7,8 --arrival mmpp --burst-ratio 6 --out sweep-mmpp6
      latroute sweep --rates 6,8 --arrival gamma --burstiness 0.25 --out sweep-gamma   # CV^2 = 4
      latroute sweep --rates 8 --routers sfs-soft --deltas 0,1e-7,1e-6,1e-5,1e-4,1e-3,1e9 --out frontier
      latroute sweep --trace azconv --rates 4,8 --requests 4000 --out sweep-az   # SLO rule, quality model
      latroute sweep --seeds 5 --out sweep-5seeds          # intervals over paired seeds
      latroute sweep --backend ray --out sweep-ray         # a local Ray, or --address HOST:PORT
      latroute sweep --spec study.toml --out study --resume
    """
    check_sweep_run(out, workers, backend, address, resume, force, trace_dir)  # before any work
    rate_list, delta_list, lam_list = list(rates), list(deltas), list(lambdas)  # range-checked by their types
    names = _routers(router_names)
    percentiles, goodput = parse_serving(percentiles_text, goodput_text)
    if first_seed + seeds - 1 > MAX_SEED:
        raise BadOption("--seeds", f"seeds {first_seed}..{first_seed + seeds - 1} go past {MAX_SEED}")
    _check_lengths(lengths_policy)
    if address is not None and backend != "ray":
        raise click.UsageError("--address goes with --backend ray")
    if resume and force:
        raise click.UsageError("--resume and --force exclude each other")
    if trace_dir is not None and (arrival is not None or burstiness != 1.0):
        raise BadOption("--arrival" if arrival is not None else "--burstiness",
                        "applies to generated workloads, not to --trace (its arrivals are rescaled to each rate)")
    if trace_dir is not None:
        from traces.arrivals import check_replay_arrivals

        t = open_trace(trace_dir)
        check_replay_arrivals(t, t.read("requests", ["arrival_s"]).iloc[:n_requests])
    kind = _arrival(arrival, burstiness)
    cells = [Cell(r, name, d, lam, s)
             for s in range(first_seed, first_seed + seeds) for lam in lam_list for name in names
             for d in (delta_list if router_entry(name).uses_delta else [0.0]) for r in rate_list]
    spec = SweepSpec(pool=pool_ref, requests=n_requests, arrival="trace" if trace_dir else kind,
                     burst_ratio=burst_ratio, burstiness=burstiness, noise=noise == "on",
                     trace=str(trace_dir) if trace_dir else None, lengths=lengths_policy, slo=slo_policy,
                     quality=quality_policy, percentiles=percentiles, goodput=tuple(goodput.items()),
                     online_speed=online_speed == "on", epsilon=epsilon, view_interval_ms=view_interval_ms,
                     ledger=ledger == "on")
    load_pool(pool_ref)  # refuse a bad pool before starting workers
    try:  # and a policy the workload cannot serve
        echo_policies(sweep_inputs(spec, cells[0]))
    except ValueError as e:
        raise BadOption("--lengths/--slo/--quality", f"{trace_dir or 'workload'}: {e}") from None
    t = time.perf_counter()
    store = SweepStore(out, spec_doc(spec, cells), resume=resume, force=force, inputs=[trace_dir])
    already = len(store.done() & {cell_key(c) for c in cells})
    bar = Progress(len(cells), backend, lambda line: click.echo(line, err=True), already)
    try:
        df, timings, summary = sweep_result(spec, cells, workers, bar.step, backend, address, store)
    except KeyboardInterrupt:
        click.echo(f"interrupted: {len(store.done())} of {len(cells)} cells are in {out}; finish with --resume",
                   err=True)
        sys.exit(130)
    except RuntimeError as e:
        raise click.UsageError(str(e)) from None
    summary["wall_s"] = time.perf_counter() - t
    summary["backend"] = backend
    write_sweep_result(store, df, timings, summary, command_line())
    click.echo(format_sweep(summary))
    click.echo(f"wrote {out}")


def format_sweep(s: dict) -> str:
    arrival = s["arrival"] + (f", burstiness {s['burstiness']:g}" if s.get("burstiness", 1.0) != 1.0 else "")
    lines = [f"{s['cells']} cells, rates {s['rate_range'][0]:g}-{s['rate_range'][1]:g} q/s ({arrival}, inter-arrival "
             f"CV^2 {s.get('interarrival_cv2', float('nan')):.2f}), {s['requests']} requests per cell, "
             f"{s.get('seeds', 1)} seed(s)"]
    if s.get("policies", {}).get("lengths", {}).get("oracle"):
        lines.insert(0, "ORACLE LENGTHS: routers saw true output lengths")
    if "oracle" in s:
        lines.append(f"ORACLE: {s['oracle']['router']} is clairvoyant (forks the twin's future: true lengths and "
                     "noise); 'of oracle' is each AUC as a share of its AUC")
    rates = [f"{r:g}" for r in s["rates"]]
    oracle = "oracle" in s  # the 'of oracle' column only when an oracle ran (else it would be all '-')
    lines.append("AUC: OnTimeUtility over the rates; vs best: AUC / the best baseline's"
                 + ("; of oracle: AUC / the oracle's" if oracle else "") + "; then OnTimeUtility at each rate")
    lines.append(f"{'router':<28} {'AUC':>8} {'vs best':>8} " + (f"{'of oracle':>9} " if oracle else "") + " "
                 + " ".join(f"{r + ' q/s':>9}" for r in rates))
    for key, v in s["routers"].items():
        ratio = v.get("auc_ratio_to_best_baseline")
        share = v.get("oracle_share")
        lines.append(f"{key:<28} {v['auc_ontime_utility']:8.4f} {'-' if ratio is None else f'{ratio:.3f}':>8} "
                     + (f"{'-' if share is None else f'{share:.3f}':>9} " if oracle else "") + " "
                     + " ".join(f"{v['by_rate'][r]['ontime_utility']:9.4f}" for r in rates))
    if "best_baseline" in s:
        lines.append(f"best baseline: {s['best_baseline']['router']} (OnTimeUtility AUC "
                     f"{s['best_baseline']['auc_ontime_utility']:.4f})")
    for key, v in s["routers"].items():
        bo = v.get("best_other")
        if bo and bo["ratio"] is not None:
            r = bo["paired"]["ratio"]
            lines.append(f"{key}: {bo['ratio']:.3f}x the best other non-oracle router ({bo['router']})"
                         + (_ci(r["ci95"]) if s.get("seeds", 1) > 1 else ""))
    if s.get("seeds", 1) > 1:
        lines.append("95% intervals over paired seeds: AUC; AUC ratio to the best baseline")
        for key, v in s["routers"].items():
            ci = v["auc_ontime_utility_ci"]
            vs = (v.get("vs_best_baseline") or {}).get("ratio") or {}
            lines.append(f"  {key:<26} {ci['mean']:.4f}{_ci(ci['ci95'])}"
                         + (f"; ratio {vs['mean']:.3f}{_ci(vs['ci95'])}" if vs else ""))
    return "\n".join(lines)


def _ci(ci) -> str:
    return "" if not ci else f" [{ci[0]:.3f}, {ci[1]:.3f}]"

