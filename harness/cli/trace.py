"""``latroute trace ...``: generate, import, inspect and query traces."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from harness.cli.choices import ARRIVAL_KINDS
from harness.cli.params import (
    AT_LEAST_1,
    BURSTINESS,
    COUNT,
    FRACTION_OPEN,
    MAX_COUNT,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    Finite,
    IntIn,
)
from traces.errors import BadInput, BadOption
from traces.policies.tasks import DEFAULT_MIX, parse_mix

# Importers, the workload generator and the trace store load numpy, pandas, pyarrow and duckdb: imported
# inside their commands so that ``trace ... --help`` and ``trace info`` start fast. Mirrors
# traces.importers.common.
DEFAULT_CHUNK_ROWS = 500_000
REQUEST_LEVEL_FORMATS = ("vllm-reqstats", "vllm-bench", "lmbench")  # measured requests of a served engine
SESSION_FORMATS = ("lmbench",)  # formats whose sessions imply prompt prefixes (docs/reference/importers.md)


def open_trace(path: Path):
    """``traces.store.open_trace``, imported when a command first opens a trace."""
    from traces.store import open_trace as open_

    return open_(path)


@click.group()
def trace() -> None:
    """Generate, import, inspect and query traces (Parquet + DuckDB)."""


# tables small by nature (a sample a second) that info checks cell by cell, as the commands reading them do;
# the summary of the large ones comes from DuckDB's aggregates, which read no cell twice
SMALL_TABLES = ("engine_series",)


def checked_small_tables(trace) -> dict[str, str]:
    """Each small table's first bad cell (``traces.checks.frame_checks``: a NaN or negative value where the schema
    allows none), as the refusal a reading command gives; empty when every one is valid."""
    out = {}
    for name in SMALL_TABLES:
        if trace.has(name):
            try:
                trace.read(name)
            except BadInput as e:
                out[name] = str(e)
    return out


@trace.command()
@click.argument("trace_dir", metavar="DIR", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
@click.option("--profile", "profile_ref", help="Also show the host speed factor of the trace's steps against this "
              "profile (path or built-in name).")
def info(trace_dir: Path, as_json: bool, profile_ref: str | None) -> None:
    """Summarise a trace: tables, span, rate, lengths, TTFT, instances.

    \b
    Example:
      latroute trace info azconv --json
      latroute trace info d1c --profile d1.json    # host speed factor of a recording
    """
    from traces.summary import format_summary, summarize

    trace = open_trace(trace_dir)
    summary = summarize(trace)
    problems = checked_small_tables(trace)
    if problems:
        summary["invalid"] = problems
    drift = {}
    if profile_ref is not None:
        from estimators.timemodel.drift import trace_drift
        from estimators.timemodel.profile import load_profile

        if not trace.has("steps"):
            raise BadInput(trace.file("steps"), None, "steps", "--profile needs a trace with steps")
        prof = load_profile(profile_ref)
        ids = trace.read("steps")["instance_id"].astype(str).unique()
        drift = trace_drift(trace, {i: prof for i in ids})
        summary["drift"] = {i: d.to_json() for i, d in drift.items()}
    if as_json:
        click.echo(json.dumps(summary, indent=2, default=str))
        return
    click.echo(format_summary(summary))
    for name, why in problems.items():
        click.echo(f"INVALID {name}: {why} (validate and calibrate refuse this table)")
    for d in drift.values():
        click.echo("\n".join(d.lines()))


@trace.command()
@click.argument("trace_dir", metavar="DIR", type=click.Path(path_type=Path))
@click.argument("sql")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
              help="Output: an aligned table, CSV, or JSON records.")
@click.option("--unsafe", is_flag=True, help="Give the SQL DuckDB's full access (files, COPY, ATTACH, extensions); "
              "by default it reads the trace's tables and nothing else.")
@click.option("--timeout", "timeout_s", type=Finite(0.0, 7 * 86400.0), default=300.0, show_default=True,
              help="Seconds the query may run before it is interrupted (error, exit 1); 0: no limit; "
                   "at most 604800 (a week). Ctrl-C interrupts it at any time (exit 130; SIGTERM: 143).")
def query(trace_dir: Path, sql: str, fmt: str, unsafe: bool, timeout_s: float) -> None:
    """Run SQL over a trace with DuckDB.

    Tables named after those present: requests, steps, step_items,
    preemptions, instances, quality, engine_series. Read-only: the SQL can open no file,
    database or extension and change no setting (DuckDB enforces it);
    --unsafe lifts that.

    \b
    Examples:
      latroute trace query wl "select task, count(*), median(prompt_tokens) from requests group by task"
      latroute trace query rec "select * from steps order by end_s - start_s desc limit 5" --format csv
    """
    from traces.query import QueryTimeout, run_query

    try:
        df = run_query(open_trace(trace_dir), sql, unsafe=unsafe, timeout_s=timeout_s)
    except QueryTimeout as e:
        raise click.ClickException(str(e)) from None
    if fmt == "csv":
        df.to_csv(sys.stdout, index=False)
    elif fmt == "json":
        click.echo(df.to_json(orient="records", date_format="iso"))
    else:
        click.echo(df.to_string(index=False) if len(df.columns) else "(no columns)")


@trace.command()
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Trace directory to write.")
@click.option("--requests", "n_requests", type=COUNT, help="Number of requests.")
@click.option("--duration", type=POSITIVE, help="Seconds of arrivals (instead of --requests).")
@click.option("--rate", type=POSITIVE,
              help="Mean arrival rate, requests/s (with --arrivals-from: rescale to this rate).")
@click.option("--arrival", type=click.Choice(ARRIVAL_KINDS),
              help="Arrival process. Default: poisson, or gamma when --burstiness is not 1.")
@click.option("--burst-ratio", type=AT_LEAST_1, default=3.0, show_default=True, help="mmpp: high/low rate ratio.")
@click.option("--high-fraction", type=FRACTION_OPEN, default=0.2, show_default=True, help="mmpp: time share in high state.")
@click.option("--correlation-s", type=POSITIVE, default=2.0, show_default=True, help="mmpp: correlation time (s).")
@click.option("--burstiness", type=BURSTINESS, default=1.0, show_default=True,
              help="Gamma shape: inter-arrival CV^2 = 1/burstiness (as vllm bench serve); other than 1 implies "
                   "--arrival gamma and is refused with poisson or mmpp.")
@click.option("--mix", default=",".join(f"{k}={v:g}" for k, v in DEFAULT_MIX.items()), show_default=True,
              help="Task weights.")
@click.option("--lengths-from", type=click.Path(path_type=Path), help="Resample (prompt, output) pairs from a trace.")
@click.option("--arrivals-from", type=click.Path(path_type=Path), help="Reuse another trace's arrival times.")
@click.option("--sessions", is_flag=True,
              help="Multi-turn chat sessions with shared system prompts and growing history (hash_ids filled); "
                   "--rate stays the request rate.")
@click.option("--turns", type=AT_LEAST_1, default=4.0, show_default=True, help="sessions: mean turns per session.")
@click.option("--think-time", type=NON_NEGATIVE, default=10.0, show_default=True, help="sessions: mean think time (s).")
@click.option("--system-prompts", type=IntIn(1, 10**6), default=4, show_default=True, help="sessions: shared system prompts.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of arrivals, lengths and SLO/accuracy draws.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def generate(out: Path, n_requests: int | None, duration: float | None, rate: float | None, arrival: str | None,
             burst_ratio: float, high_fraction: float, correlation_s: float, burstiness: float, mix: str,
             lengths_from: Path | None, arrivals_from: Path | None, sessions: bool, turns: float, think_time: float,
             system_prompts: int, seed: int, force: bool) -> None:
    """Generate a synthetic workload (requests + quality tables).

    Four tasks (alpaca, govreport, hotpotqa, writingprompts) with lognormal
    lengths, the paper's TTFT SLO formula, noisy predicted output lengths
    and per-model accuracy for pool qwen3-h100. Same arguments, same bytes.

    \b
    Examples:
      latroute trace generate --out wl --requests 16000 --rate 8
      latroute trace generate --out burst --duration 600 --rate 7 --arrival mmpp --burst-ratio 6
      latroute trace generate --out gamma --requests 16000 --rate 8 --burstiness 0.25   # gamma, CV^2 = 4
      latroute trace generate --out replay --rate 5 --arrivals-from azconv --lengths-from azconv
      latroute trace generate --out chat --sessions --duration 600 --rate 8 --turns 4
    """
    from traces.files.outputs import check_out

    check_out(out, force, inputs=[lengths_from, arrivals_from])  # before any work
    from traces.workload.arrivals import ArrivalSpec, resolve_arrival
    from traces.workload.generator import WorkloadConfig, write_workload

    if n_requests is not None and duration is not None:
        raise click.UsageError("give --requests or --duration, not both")
    if duration is not None and rate is not None and duration * rate > MAX_COUNT:
        raise BadOption("--duration", f"{duration:g} s at {rate:g} q/s is over {MAX_COUNT:,} requests")
    if arrivals_from is None:
        if n_requests is None and duration is None:
            raise click.UsageError("give --requests N or --duration S")
        if rate is None:
            raise click.UsageError("--rate is required (unless --arrivals-from is given)")
    try:
        weights = parse_mix(mix)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--mix") from None
    if sessions:
        _generate_sessions(out, n_requests, duration, rate, arrival, lengths_from, arrivals_from, weights, turns,
                           think_time, system_prompts, seed, force)
        return
    try:
        arrival = resolve_arrival(arrival, burstiness)
    except ValueError as e:
        raise BadOption("--burstiness", str(e)) from None
    if arrivals_from is not None and burstiness != 1.0:
        raise BadOption("--burstiness", "cannot reshape arrivals taken from --arrivals-from")
    if arrivals_from is not None:  # refused before any work: unknown (null) arrivals would be written as NaN
        from traces.workload.arrivals import source_arrivals
        source_arrivals(arrivals_from)
    if lengths_from is not None:  # its lengths read and checked against the schema now, not mid-write
        open_trace(lengths_from).read("requests")
    spec = ArrivalSpec(kind=arrival, rate=rate or 1.0, burst_ratio=burst_ratio, high_fraction=high_fraction,
                       correlation_s=correlation_s, burstiness=burstiness)
    try:
        spec.check()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    cfg = WorkloadConfig(requests=n_requests, duration_s=duration, arrivals=spec, rate_given=rate is not None,
                         mix=weights, seed=seed,
                         lengths_from=str(lengths_from) if lengths_from else None,
                         arrivals_from=str(arrivals_from) if arrivals_from else None)
    _write_generated(write_workload, cfg, out, force, "requests")


def _write_generated(write, cfg, out: Path, force: bool, what: str) -> None:
    t = time.perf_counter()
    try:
        rows = write(cfg, out, force=force)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    click.echo(f"wrote {out}: {rows['requests']:,} {what}, {rows['quality']:,} quality rows "
               f"in {time.perf_counter() - t:.2f} s")


def _generate_sessions(out, n_requests, duration, rate, arrival, lengths_from, arrivals_from, weights, turns,
                       think_time, system_prompts, seed, force) -> None:
    from traces.workload.sessions import SessionConfig, write_sessions

    if arrival not in (None, "poisson") or lengths_from or arrivals_from:
        raise click.UsageError("--sessions draws Poisson session arrivals and task lengths: "
                               "no --arrival, --lengths-from or --arrivals-from")
    cfg = SessionConfig(rate=rate, requests=n_requests, duration_s=duration, turns_mean=turns,
                        think_time_s=think_time, system_prompts=system_prompts, mix=weights, seed=seed)
    _write_generated(write_sessions, cfg, out, force, "requests in sessions")


@trace.command("import")
@click.argument("fmt", metavar="FORMAT")
@click.argument("src", type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Trace directory to write.")
@click.option("--model", help="burstgpt: keep only this model (e.g. ChatGPT, GPT-4).")
@click.option("--keep-failed", is_flag=True, help="burstgpt: keep failed rows (Response tokens = 0).")
@click.option("--run", help="lmbench: the run_id to import (one trace per run).")
@click.option("--seed", type=SEED, help="vllm-bench: seed of the benchmark's arrival schedule (default: from the file, else 0).")
@click.option("--engine", "engine_opts", multiple=True, metavar="KEY=VALUE",
              help="vllm-reqstats, vllm-bench, lmbench: an engine setting the source lacks or that replaces it "
                   "(repeatable; e.g. num_kv_blocks=4000, vllm_version=0.19.0, gpu=H100, tensor_parallel_size=4). "
                   "Every setting is printed as given, inferred or defaulted.")
@click.option("--accept-unmodelled", "accept_unmodelled", multiple=True, metavar="KEY",
              help="vllm-reqstats, vllm-bench, lmbench: import a run whose engine used a feature latroute does not "
                   "model (data_parallel_size, enable_expert_parallel, speculative_config, enable_lora, "
                   "kv_offloading, lmcache, kv_transfer_config, policy, ...) or a vLLM release outside 0.19.0 to "
                   "0.32.x (vllm_version), refused otherwise; every result from the trace carries it (repeatable).")
@click.option("--allow-incomplete", is_flag=True,
              help="vllm-reqstats, vllm-bench, lmbench: import a run that logged fewer requests than it sent "
                   "(refused otherwise: the missing are rarely a random sample).")
@click.option("--no-session-prefix", "no_session_prefix", is_flag=True,
              help="lmbench: keep sessions and turns but derive no prompt hash_ids from them (by default a run "
                   "whose turns carry the conversation so far gets them: docs/reference/importers.md).")
@click.option("--chunk-rows", type=COUNT, default=DEFAULT_CHUNK_ROWS, show_default=True,
              help="Rows per chunk (memory bound).")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def import_(fmt: str, src: Path, out: Path, model: str | None, keep_failed: bool, run: str | None,
            seed: int | None, engine_opts: tuple[str, ...], accept_unmodelled: tuple[str, ...],
            allow_incomplete: bool, no_session_prefix: bool, chunk_rows: int, force: bool) -> None:
    """Import a public trace format into a latroute trace.

    \b
    FORMAT is one of:
      azure        Azure LLM inference trace CSV (2023, 2024)
      burstgpt     BurstGPT CSV (--model to filter; failed rows dropped)
      mooncake     Mooncake JSONL (timestamp ms, input/output_length, hash_ids)
      vllm-bench   vllm bench serve / benchmark_serving --save-result JSON
      lmbench      llm-d-benchmark per-request LMBench CSV (--run RUN_ID)
      vllm-record  a vLLM engine recording directory (engine.json, requests.csv, steps.jsonl)
      vllm-reqstats  a vLLM run's per-request stats (requests.jsonl, timeseries.csv, meta.json)

    \b
    Examples:
      latroute trace import azure AzureLLMInferenceTrace_conv.csv --out azconv
      latroute trace import vllm-record shared/data/vllm_cpu/d1_tinya_poisson_r3 --out d1
      latroute trace import lmbench per_request.csv --run r042 --out r042
      latroute trace import vllm-reqstats shared/data/vllm_gpu_llmservingsim/RTX4090_Llama-3.1-8B --out r4090
      latroute trace import lmbench per_request.csv --run r209 --allow-incomplete --out r209

    \b
    The request-level formats (vllm-reqstats, vllm-bench, lmbench) print every
    engine setting as given, inferred (how) or defaulted (vLLM's default for the
    trace's version and GPU), refuse an engine feature latroute does not model
    unless --accept-unmodelled, and refuse a run that logged fewer requests than
    it sent unless --allow-incomplete.
    """
    from traces.files.outputs import check_out

    check_out(out, force, inputs=[src])  # before any work
    from traces.importers import import_trace
    from traces.importers.common import ImportOptions

    src_size = src.stat().st_size if src.is_file() else 0
    for name, given in (("--engine", engine_opts), ("--accept-unmodelled", accept_unmodelled),
                        ("--allow-incomplete", allow_incomplete)):
        if given and fmt not in REQUEST_LEVEL_FORMATS:
            raise BadOption(name, f"only with FORMAT {', '.join(REQUEST_LEVEL_FORMATS)} (a {fmt} import has no "
                                  "engine configuration or run size)")
    if no_session_prefix and fmt not in SESSION_FORMATS:
        raise BadOption("--no-session-prefix", f"only with FORMAT {', '.join(SESSION_FORMATS)} (a {fmt} import "
                                               "derives no prefixes from sessions)")
    opts = ImportOptions(model=model, run=run, seed=seed, keep_failed=keep_failed, chunk_rows=chunk_rows,
                         engine=engine_opts, accept_unmodelled=accept_unmodelled, allow_incomplete=allow_incomplete,
                         session_prefix=not no_session_prefix)
    t = time.perf_counter()
    if sys.stderr.isatty() and src_size > (32 << 20):
        with click.progressbar(length=src_size, label=f"importing {src.name}", file=sys.stderr) as bar:
            opts.progress = lambda pos: bar.update(pos - bar.pos)
            rows, notes = import_trace(fmt, src, out, opts, force=force)
    else:
        rows, notes = import_trace(fmt, src, out, opts, force=force)
    for note in notes:  # the engine's settings print as they are, one per line; the rest are notes
        click.echo(note if note.startswith("engine ") else f"note: {note}")
    click.echo(f"wrote {out}: " + ", ".join(f"{k} {v:,}" for k, v in rows.items())
               + f" in {time.perf_counter() - t:.2f} s")


def _add_join() -> None:
    from harness.cli.join import join

    trace.add_command(join)


_add_join()
