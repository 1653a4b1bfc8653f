"""``latroute sweep``: many twin replays (rates x routers x deltas x lambdas x
seeds), their summary table, and sweep spec files."""
from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import click

from harness.cli.choices import DEFAULT_LAMBDA, MAIN_ROUTERS, ROUTERS
from harness.cli.extras import require_extra
from harness.cli.params import (
    COUNT,
    MAX_SEED,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    FloatList,
    IntIn,
    cores,
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
from harness.cli.serving_options import parse_serving, serving_options
from harness.sweep.backends import BACKENDS, Progress, default_workers
from traces.errors import BadInput, BadOption

# The sweep driver, its store and the twin load numba, numpy, pandas and duckdb: imported where a sweep runs,
# so that ``latroute sweep --help`` does not pay for them.

SWEEP_SPEC_KEYS = ("pool", "trace", "rates", "routers", "deltas", "lambdas", "arrival", "burst_ratio", "burstiness",
                   "lengths", "slo", "quality", "requests", "seeds", "seed", "workers", "metric_percentiles", "goodput", "noise", "backend", "address",
                   "online_speed", "epsilon", "view_interval", "ledger", "ties", "retrain_every", "window")


SPEC_MAX_BYTES = 1 << 20  # a sweep specification is a few lines; larger is refused
SPEC_NAMES = {"routers": "router_names", "requests": "n_requests", "pool": "pool_ref", "trace": "trace_dir",
              "lengths": "lengths_policy", "slo": "slo_policy", "quality": "quality_policy",
              "seed": "first_seed", "metric_percentiles": "percentiles_text", "goodput": "goodput_text",
              "view_interval": "view_interval_ms", "retrain_every": "retrain_every_s"}


def _key_row(text: str, key: str) -> int | None:
    """The 1-based line that sets ``key`` in a TOML text (for the refusal)."""
    pat = re.compile(rf"""^\s*(\[\[?\s*)?["']?{re.escape(key)}["']?\s*(=|\]|\.)""")
    return next((i for i, line in enumerate(text.splitlines(), 1) if pat.match(line)), None)


def _spec_value(value, param: click.Parameter, path: Path, row: int | None, key: str) -> str:
    """A spec value as the text its flag would take: a string, a number, a
    boolean for an on/off choice, or a flat list of strings and numbers."""
    def scalar(v, where: str) -> str:
        if isinstance(v, bool):
            choices = getattr(param.type, "choices", ())
            if "on" in choices and "off" in choices and where == key:
                return "on" if v else "off"
            raise BadInput(path, row, where, f"{str(v).lower()} is not a value of --{key.replace('_', '-')}")
        if isinstance(v, (int, float, str)):
            return str(v)
        what = {dict: "a table", list: "a nested array"}.get(type(v), type(v).__name__)
        raise BadInput(path, row, where, f"expected a string, a number or an array of them, got {what}")

    if isinstance(value, list):
        items = [scalar(v, f"{key}[{i}]") for i, v in enumerate(value, 1)]
        for i, v in enumerate(items, 1):
            if "," in v:
                raise BadInput(path, row, f"{key}[{i}]", f"{v!r} holds a comma: give each item as its own array "
                               "element")
        return ",".join(items)
    return scalar(value, key)


def _spec_file(ctx: click.Context, param, path: Path | None):
    """Fill options from a TOML sweep specification; flags given on the
    command line win. Every key is checked here, naming the file, its line
    and the key: the file's shape (a [sweep] table alone, or top-level keys),
    each key known, each value the type its flag takes."""
    if path is None:
        return None
    import tomllib

    from traces.files.paths import read_text

    text = read_text(path, "--spec", max_bytes=SPEC_MAX_BYTES)  # no FIFOs, devices, directories; UTF-8
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column \d+\)", str(e))
        raise BadInput(path, int(m.group(1)) if m else None, "--spec", f"not valid TOML ({e})") from None
    except RecursionError:
        raise BadInput(path, None, "--spec", "nested too deeply to be a sweep specification") from None
    except ValueError as e:  # e.g. an integer of more digits than Python parses
        raise BadInput(path, None, "--spec", f"not a value TOML latroute reads ({e})") from None
    if "sweep" in doc:
        if not isinstance(doc["sweep"], dict):
            what = "an array of tables ([[sweep]])" if isinstance(doc["sweep"], list) else "a value"
            raise BadInput(path, _key_row(text, "sweep"), "sweep",
                           f"expected one [sweep] table, got {what}")
        beside = sorted(set(doc) - {"sweep"})
        if beside:
            raise BadInput(path, _key_row(text, beside[0]), beside[0], "a key beside the [sweep] table (put every "
                           f"key inside [sweep]; outside it: {', '.join(beside)})")
        sweep_doc = doc["sweep"]
    else:
        sweep_doc = doc
    unknown = sorted(set(sweep_doc) - set(SWEEP_SPEC_KEYS))
    if unknown:
        raise BadInput(path, _key_row(text, unknown[0]), unknown[0],
                       f"unknown key (known: {', '.join(SWEEP_SPEC_KEYS)})")
    params = {p.name: p for p in ctx.command.params}
    defaults = ctx.default_map or {}
    for key, value in sweep_doc.items():
        name = SPEC_NAMES.get(key, key)
        row = _key_row(text, key)
        text_value = _spec_value(value, params[name], path, row, key)
        try:  # the flag's own type checks it now, so the refusal names the file and the key
            params[name].type.convert(text_value, params[name], ctx)
            if key == "routers":  # names, checked here too: a misspelt router is the file's fault
                parse_routers(str(text_value))
        except click.BadParameter as e:
            raise BadInput(path, row, key, e.format_message()) from None
        defaults[name] = text_value
    ctx.default_map = defaults
    return path


@click.command()
@click.option("--spec", "spec_path", type=click.Path(path_type=Path), callback=_spec_file, is_eager=True,
              expose_value=False, help="TOML file with the sweep's options (a [sweep] table or top-level keys named "
                                       "like the flags: rates = [3, 4, 5], routers = [...]); flags override it. "
                                       "At most 1 MB, UTF-8; an unknown key, or a key beside the [sweep] table, "
                                       "is refused.")
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
@ties_option
@learned_options
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Result directory: cells/, results.parquet, metrics.json, metrics.parquet.")
@click.option("--resume", is_flag=True, help="Continue the sweep in --out: run only the cells it lacks (the "
                                             "specification must be the same).")
@click.option("--force", is_flag=True, help="Replace --out if a latroute sweep wrote it.")
@isolation_options
def sweep(pool_ref, trace_dir, rates, router_names, deltas, lambdas, arrival, burst_ratio, burstiness,
          lengths_policy, slo_policy, quality_policy, n_requests, percentiles_text, goodput_text, seeds, first_seed,
          workers, backend, address, online_speed, noise, epsilon, view_interval_ms, ledger, ties, retrain_every_s, window, out, resume,
          force, isolate_plugins, plugin_timeout_s) -> None:
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
      latroute sweep --pool my-pool.json --slo constant:500 --quality acc.csv --out sweep-mine   # your models
    """
    if backend == "ray":  # before anything else: without Ray nothing can run
        require_extra("sweep --backend ray", "ray")
    from harness.sweep.driver import Cell, SweepSpec, check_sweep_run, spec_doc, sweep_result, write_sweep_result
    from harness.sweep.prechecks import check_routers
    from harness.sweep.store import SweepStore, cell_key
    from harness.twin.pools.spec import load_pool
    from reports.results import command_line
    from routers.registry import router_entry
    from traces.store import open_trace

    check_sweep_run(out, workers, backend, address, resume, force, trace_dir)  # before any work
    rate_list, delta_list, lam_list = list(rates), list(deltas), list(lambdas)  # range-checked by their types
    names = parse_routers(router_names)
    percentiles, goodput = parse_serving(percentiles_text, goodput_text)
    if first_seed + seeds - 1 > MAX_SEED:
        raise BadOption("--seeds", f"seeds {first_seed}..{first_seed + seeds - 1} go past {MAX_SEED}")
    check_lengths_option(lengths_policy)
    isolate_s = plugin_timeout(isolate_plugins, plugin_timeout_s)
    if address is not None and backend != "ray":
        raise click.UsageError("--address goes with --backend ray")
    if resume and force:
        raise click.UsageError("--resume and --force exclude each other")
    if trace_dir is not None and (arrival is not None or burstiness != 1.0):
        raise BadOption("--arrival" if arrival is not None else "--burstiness",
                        "applies to generated workloads, not to --trace (its arrivals are rescaled to each rate)")
    if trace_dir is not None:
        from traces.workload.arrivals import check_replay_arrivals

        t = open_trace(trace_dir)
        check_replay_arrivals(t, t.read("requests", ["arrival_s"]).iloc[:n_requests])
    kind = arrival_kind(arrival, burstiness)
    cells = [Cell(r, name, d, lam, s)
             for s in range(first_seed, first_seed + seeds) for lam in lam_list for name in names
             for d in (delta_list if router_entry(name).uses_delta else [0.0]) for r in rate_list]
    spec = SweepSpec(pool=pool_ref, requests=n_requests, arrival="trace" if trace_dir else kind,
                     burst_ratio=burst_ratio, burstiness=burstiness, noise=noise == "on",
                     trace=str(trace_dir) if trace_dir else None, lengths=lengths_policy, slo=slo_policy,
                     quality=quality_policy, percentiles=percentiles, goodput=tuple(goodput.items()),
                     online_speed=online_speed == "on", epsilon=epsilon, view_interval_ms=view_interval_ms,
                     ledger=ledger == "on", ties=ties, retrain_every_s=retrain_every_s, window=window,
                     plugin_timeout_s=isolate_s)
    pool = load_pool(pool_ref)  # refuse a bad pool before starting workers
    check_quality_option(quality_policy, [c.model for c in pool.instances])  # and a quality file not for it
    try:  # and a policy the workload cannot serve, and a plug-in router that cannot be built
        echo_policies(check_routers(spec, cells))
    except ValueError as e:
        raise BadOption("--lengths/--slo/--quality", f"{trace_dir or 'workload'}: {e}") from None
    t = time.perf_counter()
    existed = os.path.lexists(out)
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
    except BadInput:  # a plug-in's fault found while a cell ran: a sweep this run began leaves nothing behind
        store.close()
        if not existed:
            shutil.rmtree(out, ignore_errors=True)
        raise
    summary["wall_s"] = time.perf_counter() - t
    summary["backend"] = backend
    write_sweep_result(store, df, timings, summary, command_line())
    no_accuracy = summary.get("policies", {}).get("quality", {}).get("policy") == "none"
    click.echo(format_sweep(summary, slo_goodput_by_rate(df, summary["router_capabilities"]) if no_accuracy else None))
    click.echo(f"wrote {out}")


def slo_goodput_by_rate(df, caps: dict) -> dict[str, dict[str, float]]:
    """Per router key and rate, the mean over seeds of the cells' SLO
    goodput (``reports.serving.cells_slo_goodput``)."""
    from harness.sweep.driver import router_key
    from reports.serving import cells_slo_goodput

    several = df["lam"].nunique() > 1
    good = cells_slo_goodput(df)
    out: dict[str, dict[str, float]] = {}
    for (lam, router, delta, rate), g in good.groupby([df["lam"], df["router"], df["delta_per_us"], df["rate"]]):
        out.setdefault(router_key(router, delta, lam, several, caps), {})[f"{rate:g}"] = float(g.mean())
    return out


def format_sweep(s: dict, goodput: dict | None = None) -> str:
    """The sweep's summary lines; ``goodput`` (``slo_goodput_by_rate``):
    the pool has no accuracy (quality none), so SLO attainment and goodput
    lead and OnTimeUtility follows."""
    arrival = s["arrival"] + (f", burstiness {s['burstiness']:g}" if s.get("burstiness", 1.0) != 1.0 else "")
    lines = [f"{s['cells']} cells, rates {s['rate_range'][0]:g}-{s['rate_range'][1]:g} q/s ({arrival}, inter-arrival "
             f"CV^2 {s.get('interarrival_cv2', float('nan')):.2f}), {s['requests']} requests per cell, "
             f"{s.get('seeds', 1)} seed(s)"]
    if s.get("policies", {}).get("lengths", {}).get("oracle"):
        lines.insert(0, "ORACLE LENGTHS: routers saw true output lengths")
    if s.get("plugins_isolated"):
        lines.append(f"plug-in routers isolated: each in a process of its own, {s['plugin_timeout_s']:g} s per call")
    if "oracle" in s:
        lines.append(f"ORACLE: {s['oracle']['router']} is clairvoyant (forks the twin's future: true lengths and "
                     "noise); 'of oracle' is each AUC as a share of its AUC")
    rates = [f"{r:g}" for r in s["rates"]]
    if goodput is not None:
        lines.append("no accuracy (quality none): SLO attainment AUC over the rates, then SLO attainment / SLO "
                     "goodput (req/s within their SLO) at each rate")
        lines.append(f"{'router':<28} {'AUC att':>8}  " + " ".join(f"{r + ' q/s':>15}" for r in rates))
        for key, v in s["routers"].items():
            lines.append(f"{key:<28} {v['auc_slo_attainment']:8.3f}  " + " ".join(
                f"{100 * v['by_rate'][r]['slo_attainment']:6.1f}% {goodput.get(key, {}).get(r, float('nan')):7.2f}"
                for r in rates))
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
