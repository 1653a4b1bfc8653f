"""``latroute study NAME``: the studies whose tables the results pages show, one subcommand each.

Each subcommand is a thin wrapper over a module of ``harness.studies``, imported where the study
runs, so that ``latroute study NAME --help`` loads none of the numeric stack. A new study adds a
function here (its options and a lazy import) and a module under ``harness/studies/``.
"""
from __future__ import annotations

from pathlib import Path

import click

from harness.cli.choices import TIE_POLICIES
from harness.cli.extras import require_extra
from harness.cli.params import COUNT, POSITIVE, SEED, Finite, IntIn, refuse_given, refuse_non_utf8

GPU_RUNS = Path("../shared/data/vllm_gpu_llmservingsim")


@click.group()
def study() -> None:
    """Run a study and write the tables its results page shows.

    \b
    Examples:
      latroute study gpu-fidelity --out gpu-fidelity   # docs/results/gpu-fidelity.md
      latroute study lmbench-h100 --out lmbench        # docs/results/lmbench-h100.md
      latroute study fleet-acceptance x8-r24 x8-r48    # docs/results/fleet.md
      latroute study route-live serve OUT              # docs/results/routing-live.md
    """


@study.command("gpu-fidelity")
@click.option("--data", type=click.Path(path_type=Path, file_okay=False), default=GPU_RUNS, show_default=True,
              help="The two vLLM GPU runs (RTX4090_Llama-3.1-8B, RTXPRO6000_Qwen3-32B), as shared.")
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Directory for results.json, tables.md, the imported traces and the fitted profiles.")
@click.option("--variant", "variants", multiple=True, metavar="NAME",
              help="Run only this variant of the fit (repeatable; default: every variant, the page's table).")
@click.option("--jobs", type=IntIn(1, 64), default=1, show_default=True,
              help="Fits run at a time, each in a process of its own (the results do not depend on it).")
@click.option("--vllm-version", "vllm_version", default=None, metavar="X.Y.Z",
              help="Replay both runs under this vLLM release's scheduling rules (0.19.0 to 0.32.x) instead of "
                   "the one their logs state (0.19.0).")
def gpu_fidelity(data: Path, out: Path, variants: tuple[str, ...], jobs: int, vllm_version: str | None) -> None:
    """Fit each GPU run's first 50% and first 30% of timings; score the second half.

    Every variant of the request-level fit is also scored on the fit window alone (fitted on its first
    two thirds, scored on its last third); the variant with the smallest error there is the page's.
    """
    refuse_non_utf8({"--data": data, "--out": out})
    from harness.studies import gpu_fidelity as g
    from traces.errors import BadOption

    known = {v.name: v for v in g.VARIANTS}
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise BadOption("--variant", f"{unknown[0]!r} is not one of: {', '.join(known)}")
    if not (data / g.RUNS[0][1]).is_dir():
        raise BadOption("--data", f"{data} has no {g.RUNS[0][1]} (the shared vllm_gpu_llmservingsim folder)")
    if vllm_version is not None:
        from estimators.engine.releases import in_window, window_text

        if not in_window(vllm_version):
            raise BadOption("--vllm-version", f"{vllm_version!r} is outside the releases whose scheduling rules "
                                              f"latroute models ({window_text()})")
    out.mkdir(parents=True, exist_ok=True)
    g.study(data, out, tuple(known[v] for v in variants) or g.VARIANTS, echo=click.echo, jobs=jobs,
            vllm_version=vllm_version)


LMBENCH = Path("../shared/data/llmd_lmbench_per_request")


@study.command("lmbench-h100")
@click.option("--data", type=click.Path(path_type=Path, file_okay=False), default=LMBENCH, show_default=True,
              help="llm-d-benchmark's LMBench per-request logs (per_request.csv and runs.csv), as shared.")
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Directory for results.json, tables.md, commands.log, the imported traces, profiles and results "
                   "(kept: a rerun reuses what is there).")
@click.option("--assign-seeds", "seeds", type=IntIn(1, 100), default=5, show_default=True,
              help="Seeds of each assignment of requests to replicas (and of the routers' replays).")
@click.option("--group", "groups", multiple=True, type=click.Choice(["sharegpt", "short_input", "exp4"]),
              help="Run only this group of runs (repeatable; default: all three and the routing question).")
def lmbench_h100(data: Path, out: Path, seeds: int, groups: tuple[str, ...]) -> None:
    """Calibrate, validate and score the H100 LMBench fleets; compare their routing.

    \b
    A fleet fit of the vLLM round-robin deployment (2 replicas) from its 4/8/12 q/s
    sharegpt runs, validated on every other run (active replicas, assignment seeds),
    estimate MAPE per rate, and the three stacks on the requests all three logged
    beside the twin's routers; the short_input runs fitted on their own 0.5-1.5 q/s
    runs; exp-4's Llama-4-Scout runs (docs/results/lmbench-h100.md).
    """
    refuse_non_utf8({"--data": data, "--out": out})
    from traces.errors import BadOption

    for name in ("per_request.csv", "runs.csv"):
        if not (data / name).is_file():
            raise BadOption("--data", f"{data} has no {name} (the shared llmd_lmbench_per_request folder)")
    from harness.studies import lmbench_h100 as s

    try:
        s.study(data, out, seeds, groups, routing=not groups or "sharegpt" in groups, echo=click.echo)
    except s.StudyError as e:
        raise click.ClickException(str(e)) from None


PORT = IntIn(1024, 65535)
SWEEPS = click.Path(path_type=Path, exists=True, file_okay=False)


def _pool(pool: str) -> None:
    """A pool that does not load (an unknown name, a bad file) refused before any process starts."""
    from harness.twin.pools.spec import load_pool

    load_pool(pool)


def _views(text: str, option: str) -> list[str]:
    """A comma-separated list of views (exact, ledger, metrics:MS), refused by name if one is none of them."""
    from traces.errors import BadOption

    views = text.split(",")
    bad = [v for v in views if v not in ("exact", "ledger") and not (v.startswith("metrics:") and v[8:].isdigit()
                                                                   and int(v[8:]) > 0)]
    if bad:
        raise BadOption(option, f"{bad[0]!r} is not exact, ledger or metrics:MS")
    return views


HELD_OUT = ("real2/join/join.parquet", "real3/join/join.parquet")  # what serve-real's comparisons read first


def _need(dirs, names: tuple[str, ...], what: str) -> None:
    """BadInput for the first of ``names`` missing in any of ``dirs``: ``what`` says which directory it wants."""
    from traces.errors import BadInput

    for d in dirs:
        for name in names:
            if not (d / name).exists():
                raise BadInput(d / name, None, "input", f"not found: {what}")


@study.command("fleet-acceptance")
@click.argument("sweeps", nargs=-1, required=True, type=SWEEPS)
@click.option("--json", "json_out", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the numbers as JSON.")
def fleet_acceptance(sweeps: tuple[Path, ...], json_out: Path | None) -> None:
    """Combine sweeps of one pool into the fleet table: AUC per router, share of the oracle's, best SFS vs the rest.

    Each rate and each tie policy is its own sweep (a fleet cell simulates >= 500 s at every
    rate); the cells pair across sweeps by seed (docs/results/fleet.md). Prints Markdown.
    """
    refuse_non_utf8({"SWEEPS": sweeps, "--json": json_out})
    _need(sweeps, ("sweep.json",), "a directory latroute sweep wrote")
    import json

    from harness.studies.fleet_acceptance import acceptance, load_cells, markdown

    res = acceptance(load_cells(list(sweeps)))
    click.echo(markdown(res))
    if json_out:
        json_out.write_text(json.dumps(res, indent=2, default=float) + "\n")


@study.group("route-live")
def route_live() -> None:
    """Routers through `latroute route` on live backends against the twin's prediction of them.

    \b
    One workload goes open loop through `latroute route` with each router in
    turn, on the same backends, in a seeded random order per repeat; `replay`
    predicts each router's figures on the twin of the same pool; the report
    sets measured and predicted OnTimeUtility, SLO attainment, TTFT and
    shares side by side, with Kendall's tau (docs/results/routing-live.md).
    """


def _live_options(f):
    for opt in reversed([
        click.argument("out", type=click.Path(path_type=Path, file_okay=False)),
        click.option("--routers", default="round-robin,shortest-queue,latency-agnostic,sfs-hard,sfs-cc",
                     show_default=True, help="Comma-separated routers, each run once per repeat."),
        click.option("--repeats", type=IntIn(1, 1000), default=2, show_default=True,
                     help="Runs of each router (a seeded random order per repeat)."),
        click.option("--seed", type=SEED, default=0, show_default=True, help="Workload and run order seed."),
        click.option("--twin-seeds", type=IntIn(1, 1000), default=3, show_default=True,
                     help="Noise seeds of the twin's prediction (their mean)."),
        click.option("--requests", type=COUNT, default=300, show_default=True, help="Requests per run."),
        click.option("--ties", type=click.Choice(TIE_POLICIES),
                     help="The proxy's and the twin's replica choice (default: theirs)."),
    ]):
        f = opt(f)
    return f


def _run_live(entry: str, **kw) -> None:
    """The study's entry for these backends, given the options as one namespace (its ``a``)."""
    from types import SimpleNamespace

    from harness.studies import route_live as s

    run = {"real": s.real_main, "serve": s.serve_main, "backends": s.backends_main}[entry]
    run(SimpleNamespace(**kw))


@route_live.command("real")
@_live_options
@click.option("--pool", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              help="Pool file of the two servers (default: docs/pools/tiny-ab.json).")
@click.option("--rate", type=POSITIVE, default=2.0, show_default=True, help="Requests per second.")
@click.option("--slo-scale", type=POSITIVE, default=4.0, show_default=True,
              help="SLO = the paper's rule x this (the rule is an H100's).")
@click.option("--vllm-python", help="vLLM's interpreter (default: $LATROUTE_VLLM_PYTHON).")
@click.option("--calibrate", is_flag=True, help="Record a calibration workload first and fit the profiles on it.")
@click.option("--calibrate-only", is_flag=True, help="With --calibrate: stop after the calibration.")
@click.option("--calibration-rate", type=POSITIVE, default=3.0, show_default=True,
              help="Requests per second of the calibration workload.")
@click.option("--view", type=click.Choice(["ledger", "exact", "metrics:100", "metrics:1000"]), default="ledger",
              show_default=True,
              help="exact: the servers' recording schedulers publish their state (LATROUTE_STATE_LISTEN).")
@click.pass_context
def route_live_real(ctx: click.Context, **kw) -> None:
    """Two real vLLM CPU servers (tiny-a, tiny-b), each pinned to one core."""
    if not kw["calibrate"]:
        refuse_given(ctx, {"calibrate_only": "--calibrate-only", "calibration_rate": "--calibration-rate"},
                     "needs --calibrate (it sets the calibration run)")
    if kw["pool"] is None:
        from harness.studies.live_servers import REPO

        kw["pool"] = REPO / "docs" / "pools" / "tiny-ab.json"
    require_extra("study route-live real", "serve")
    refuse_non_utf8({"OUT": kw["out"], "--pool": kw["pool"]})
    _run_live("real", **kw)


@route_live.command("serve")
@_live_options
@click.option("--pool", default="qwen3-h100-x8", show_default=True, help="Built-in pool or pool file of the backends.")
@click.option("--rate", type=POSITIVE, default=24.0, show_default=True, help="Requests per engine second.")
@click.option("--speed", type=Finite(0.01, 100.0), default=1.0, show_default=True,
              help="The backends' clock (latroute serve --speed).")
@click.option("--views", default="exact", show_default=True,
              help="Comma-separated views, a study each: exact, ledger, metrics:MS.")
@click.option("--stream-interval", type=IntIn(1, 1 << 20), default=1, show_default=True,
              help="serve's tokens per streamed chunk (the first at once).")
def route_live_serve(**kw) -> None:
    """`latroute serve` backends of a pool, started fresh for each run."""
    require_extra("study route-live serve", "serve")
    refuse_non_utf8({"OUT": kw["out"], "--pool": kw["pool"]})
    _views(kw["views"], "--views")
    _pool(kw["pool"])
    _run_live("serve", **kw)


@route_live.command("backends")
@_live_options
@click.option("--pool", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True,
              help="Pool file: every entry with its server's url.")
@click.option("--trace", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True,
              help="The workload (SLOs, predicted lengths, quality table).")
@click.option("--speed", type=Finite(0.01, 100.0), default=1.0, show_default=True,
              help="The backends' clock (latroute serve --speed); 1: real.")
@click.option("--view", default="ledger", show_default=True, help="exact, ledger or metrics:MS.")
def route_live_backends(**kw) -> None:
    """Servers already running, named by a pool file whose entries carry their url."""
    require_extra("study route-live backends", "serve")
    refuse_non_utf8({"OUT": kw["out"], "--pool": kw["pool"], "--trace": kw["trace"]})
    if len(_views(kw["view"], "--view")) != 1:
        from traces.errors import BadOption

        raise BadOption("--view", "takes one view (exact, ledger or metrics:MS)")
    _run_live("backends", **kw)


@route_live.command("report")
@click.argument("out", type=click.Path(path_type=Path, file_okay=False, exists=True))
def route_live_report(out: Path) -> None:
    """The table of a finished (or interrupted) study again."""
    _need([out], ("results.json",), "a directory the study wrote")
    from harness.studies.route_live_report import report

    click.echo(report(out.resolve()))


@route_live.command("diagnose")
@click.argument("out", type=click.Path(path_type=Path, file_okay=False, exists=True))
def route_live_diagnose(out: Path) -> None:
    """Validate each run's recording; front end and estimate error per run."""
    _need([out], ("results.json", "pool-twin.json"), "a directory the study of real servers wrote")
    from harness.studies.route_live_report import diagnose

    click.echo(diagnose(out.resolve()))


def served_workload_options(pool: str, requests: int, requests_help: str):
    """The pool, workload and ports of a study that drives ``latroute serve`` (its defaults its own)."""
    def add(f):
        for option in reversed((
                click.option("--pool", default=pool, show_default=True, help="Built-in pool or pool file."),
                click.option("--rate", type=POSITIVE, default=8.0, show_default=True, help="Requests per second."),
                click.option("--requests", type=COUNT, default=requests, show_default=True, help=requests_help),
                click.option("--port-base", type=PORT, default=8100, show_default=True,
                             help="Instance k listens on 127.0.0.1:PORT_BASE+k."),
                click.option("--stream-interval", type=IntIn(1, 1 << 20), default=1, show_default=True,
                             help="serve's tokens per streamed chunk."))):
            f = option(f)
        return f
    return add


@study.command("serve-faithfulness")
@click.argument("out", type=click.Path(path_type=Path, file_okay=False))
@served_workload_options("qwen3-h100", 2000, "Requests of the workload.")
def serve_faithfulness(out: Path, pool: str, rate: float, requests: int, port_base: int,
                       stream_interval: int) -> None:
    """Compare an emulated run (serve driven by loadgen) with the offline twin's, request for request.

    An offline replay fixes arrivals and assignment; serve and loadgen run them on
    loopback; the client's TTFTs are compared with the offline twin's, with serve's
    own delivery lag as the bound (docs/results/serve-faithfulness.md).
    """
    require_extra("study serve-faithfulness", "serve")
    refuse_non_utf8({"OUT": out, "--pool": pool})
    _pool(pool)
    import json

    from harness.studies.serve_faithfulness import study as run

    click.echo(json.dumps(run(out, pool, rate, requests, port_base, stream_interval), indent=1))


@study.command("serve-real")
@click.argument("out", type=click.Path(path_type=Path, file_okay=False))
@click.option("--workload", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="The workload trace (required unless --compare-only).")
@click.option("--requests", type=COUNT, default=200, show_default=True, help="The workload's first N requests.")
@click.option("--vllm-python", help="vLLM's interpreter (default: $LATROUTE_VLLM_PYTHON).")
@click.option("--port", type=PORT, default=18765, show_default=True, help="The real server's port (serve: +100).")
@click.option("--noise", type=click.Choice(["on", "off"]), default="off", show_default=True,
              help="serve's step noise.")
@click.option("--compare-only", is_flag=True, help="Run nothing: compare what OUT holds.")
@click.option("--only", "steps", help="Comma-separated steps to (re)run (default: all): real0, real1, calibrate, "
                                      "real2, real3, serve-fo0, serve-join, serve.")
def serve_real(out: Path, workload: Path | None, requests: int, vllm_python: str | None, port: int, noise: str,
               compare_only: bool, steps: str | None) -> None:
    """Compare serve, calibrated on one real vLLM run, with two more real runs of that server.

    \b
    real0 (warm-up), real1 (recorded, calibrated on), real2 and real3 (held out):
    a real vLLM CPU server of tiny-a each time; then serve on real1's profile;
    loadgen against each, /metrics sampled once a second
    (docs/results/serve-faithfulness.md).
    """
    import os

    from traces.errors import BadOption

    require_extra("study serve-real", "serve")
    refuse_non_utf8({"OUT": out, "--workload": workload})
    if compare_only and (steps or workload):
        raise BadOption("--compare-only", "runs nothing: it takes neither --only nor --workload")
    from harness.studies import serve_real_faithfulness as s

    chosen = tuple(steps.split(",")) if steps else s.STEPS
    unknown = [x for x in chosen if x not in s.STEPS]
    if unknown:
        raise BadOption("--only", f"{unknown[0]!r} is not one of: {', '.join(s.STEPS)}")
    if not compare_only and workload is None:
        raise BadOption("--workload", "is needed to run the servers (or give --compare-only)")
    if compare_only:
        _need([out], HELD_OUT, "a directory serve-real wrote, its held-out runs finished")
    s.study(out, workload, requests, vllm_python or os.environ.get("LATROUTE_VLLM_PYTHON"), port, noise,
            () if compare_only else chosen)


@study.command("serve-real-drift")
@click.argument("outs", nargs=-1, required=True, type=click.Path(path_type=Path, file_okay=False, exists=True))
def serve_real_drift(outs: tuple[Path, ...]) -> None:
    """How the real runs' step durations drift, from directories serve-real wrote.

    Per run: actual / typical step time, its autocorrelation, the API-to-scheduler
    hand-over; between the held-out runs, engine TTFT MAPE with and without the
    hand-over. Prints Markdown tables.
    """
    refuse_non_utf8({"OUT": outs})
    _need(outs, HELD_OUT, "a directory serve-real wrote, its held-out runs finished")
    from harness.studies.serve_real_drift import study as run

    run(list(outs))


@study.command("real-speed-cause")
@click.argument("out", type=click.Path(path_type=Path, file_okay=False))
@click.option("--workload", type=click.Path(path_type=Path, file_okay=False, exists=True), required=True,
              help="The workload trace.")
@click.option("--profile", type=click.Path(path_type=Path, dir_okay=False, exists=True), required=True,
              help="The profile whose typical step time the runs are measured against.")
@click.option("--runs", type=IntIn(1, 100), default=3, show_default=True, help="Real runs, one after another.")
@click.option("--requests", type=COUNT, default=100, show_default=True, help="The workload's first N requests.")
@click.option("--thp", is_flag=True, help="Run the servers with THP_MEM_ALLOC_ENABLE=1 (2 MB pages).")
@click.option("--vllm-python", help="vLLM's interpreter (default: $LATROUTE_VLLM_PYTHON).")
@click.option("--port", type=PORT, default=18765, show_default=True, help="The real server's port.")
def real_speed_cause(out: Path, workload: Path, profile: Path, runs: int, requests: int, thp: bool,
                     vllm_python: str | None, port: int) -> None:
    """How far a real vLLM CPU server's speed moves between runs, and whether the machine moves with it.

    Before each short real run, a fixed piece of CPU work is timed on the server's
    core; each run's steps are set against the profile's typical time.
    """
    import os

    require_extra("study real-speed-cause", "loadgen")
    refuse_non_utf8({"OUT": out, "--workload": workload, "--profile": profile})
    from harness.studies.real_speed_cause import study as run

    run(out, workload, profile, runs, requests, thp, vllm_python or os.environ.get("LATROUTE_VLLM_PYTHON"), port)


@study.command("serve-scale")
@click.argument("out", type=click.Path(path_type=Path, file_okay=False))
@served_workload_options("qwen3-h100-x8", 800, "Requests of the generated workload.")
@click.option("--py-spy", "spy", help="py-spy's executable: also profile the server, and sort its samples.")
def serve_scale(out: Path, pool: str, rate: float, requests: int, port_base: int, stream_interval: int,
                spy: str | None) -> None:
    """How large a pool, at what rate, one serve process holds with p99 step-delivery lag <= 5 ms."""
    require_extra("study serve-scale", "serve")
    refuse_non_utf8({"OUT": out, "--pool": pool})
    _pool(pool)
    import json

    from harness.studies.serve_scale import study as run

    click.echo(json.dumps(run(out, pool, rate, requests, port_base, stream_interval, spy), indent=1))


@study.command("learned")
@click.argument("out", type=click.Path(path_type=Path, file_okay=False))
@click.option("--timeout", type=Finite(1.0, 86400.0), default=300.0, show_default=True,
              help="Seconds allowed to each latroute command.")
@click.option("--only", type=click.Choice(["recordings", "requests"]),
              help="Only the vllm_cpu recordings, or only the A100 request-level runs (default: both).")
def learned(out: Path, timeout: float, only: str | None) -> None:
    """SFS vs the learned (llm-d style) estimator vs the throughput baseline, and the learned model's training cost.

    About 30 latroute commands (imports, calibrations, estimates), each printed and
    recorded in OUT/commands.txt; existing outputs are reused, so an interrupted run
    resumes. Writes OUT/tables.md (docs/results/learned-estimates.md).
    """
    require_extra("study learned", "learned")
    refuse_non_utf8({"OUT": out})
    from harness.studies.learned_study import study as run

    click.echo(run(out, timeout, only))


@study.command("learned-fit-cost")
@click.option("--windows", default="100,1000,10000", show_default=True,
              help="Comma-separated training window sizes (samples), each in [10, 1000000].")
@click.option("--repeats", type=IntIn(1, 100), default=5, show_default=True, help="Refits timed per window.")
def learned_fit_cost(windows: str, repeats: int) -> None:
    """Wall time of one learned-model refit and one prediction, by training window size."""
    from traces.errors import BadOption

    sizes = tuple(IntIn(10, 10**6).check(w) for w in windows.split(","))
    if None in sizes:
        raise BadOption("--windows", f"{windows!r} is not a comma-separated list of integers in [10, 1000000]")
    require_extra("study learned-fit-cost", "learned")
    from harness.studies.learned_fit_cost import study as run

    run(sizes, repeats)


@study.command("itl-joins")
@click.argument("trace", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.argument("profile", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--prefix-cache", type=click.Choice(["cold", "warm"]), default="cold", show_default=True,
              help="The prefix cache at the trace's start, as validate --prefix-cache.")
def itl_joins(trace: Path, profile: Path, prefix_cache: str) -> None:
    """What a joining request costs the running ones, from a vllm-bench trace's ITLs and from the twin's steps.

    TRACE: `latroute trace import vllm-bench` output (with requests.itls_s); PROFILE:
    `calibrate --from-requests` output. Prints, for both, the least-squares fit
    ITL ~ c0 + c_any*[joins>0] + c_join*joins + c_run*running + c_tok*joiners' prompt tokens.
    """
    refuse_non_utf8({"TRACE": trace, "PROFILE": profile})
    from harness.studies.itl_joins import study as run

    run(trace, profile, prefix_cache)


@study.command("fleet-diagnosis")
@click.option("--pool", default="qwen3-h100-x8", show_default=True, help="Built-in pool or pool file.")
@click.option("--rate", type=POSITIVE, required=True, help="Requests per second (the sweep cell's).")
@click.option("--requests", type=COUNT, required=True, help="Requests of the cell.")
@click.option("--router", default="sfs-cc", show_default=True, help="The router whose decisions are recorded.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="The cell's seed (workload and twin).")
@click.option("--ties", type=click.Choice(TIE_POLICIES),
              help="Replica choice of the two-level routers (default: theirs).")
@click.option("--noise", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="The twin's step-time noise.")
@click.option("--lengths", help="Predicted-length policy, as sweep --lengths (e.g. oracle; default: sweep's).")
@click.option("--out", required=True, type=click.Path(path_type=Path, file_okay=False),
              help="Directory for decisions.parquet and summary.json.")
def fleet_diagnosis(pool: str, rate: float, requests: int, router: str, seed: int, ties: str | None, noise: str,
                    lengths: str | None, out: Path) -> None:
    """Replay one sweep cell with every decision recorded: replica, estimated slack, measured TTFT, on time.

    The cell is the sweep's own (its workload and replay configuration), so it pairs
    with the sweep's row (docs/results/fleet.md). Prints the on-time utility, SLO
    attainment and misses by same-replica gap.
    """
    refuse_non_utf8({"--pool": pool, "--out": out})
    _pool(pool)
    import json

    from harness.studies.fleet_diagnosis import run

    s = run(pool, rate, requests, router, seed, ties, noise == "on", lengths, out)
    click.echo(json.dumps({k: s[k] for k in ("ontime_utility", "slo_attainment", "by_same_replica_gap")}, indent=1))


@study.command("fleet-diagnosis-figure")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.option("--labels", help="Comma-separated labels, one per run (default: each run's tie policy).")
@click.option("--out", required=True, type=click.Path(path_type=Path, dir_okay=False), help="The figure (PNG).")
def fleet_diagnosis_figure(runs: tuple[Path, ...], labels: str | None, out: Path) -> None:
    """Draw fleet-diagnosis runs side by side: load per replica, misses by estimated slack and by gap."""
    from traces.errors import BadOption

    refuse_non_utf8({"RUNS": runs, "--out": out})
    _need(runs, ("decisions.parquet", "summary.json"), "a directory study fleet-diagnosis wrote")
    names = labels.split(",") if labels else None
    if names is not None and len(names) != len(runs):
        raise BadOption("--labels", f"{len(names)} labels for {len(runs)} runs")
    from reports.fleet_diagnosis import draw

    draw(list(runs), names, out)
    click.echo(f"wrote {out}")


@study.command("router-shares")
@click.argument("sweeps", nargs=-1, required=True, type=SWEEPS)
@click.option("--reference", default="sfs-cc", show_default=True, help="The label the others are compared with.")
def router_shares(sweeps: tuple[Path, ...], reference: str) -> None:
    """Each router's share of the oracle and ratio to a reference router, paired over seeds, with cell wall times.

    Sweeps of one pool (one per rate, as fleet-acceptance reads them); prints Markdown
    (docs/results/learned-routing.md).
    """
    refuse_non_utf8({"SWEEPS": sweeps})
    _need(sweeps, ("sweep.json",), "a directory latroute sweep wrote")
    from harness.studies.fleet_acceptance import load_cells
    from harness.studies.router_shares import markdown, shares
    from traces.errors import BadOption

    try:
        res = shares(load_cells(list(sweeps)), reference)
    except ValueError as e:  # the one refusal of shares: no router with that label
        raise BadOption("--reference", str(e)) from None
    click.echo(markdown(res))


@study.command("coverage")
@click.argument("recordings", type=click.Path(path_type=Path, file_okay=False, exists=True))
@click.argument("out", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--online-speed", is_flag=True, help="SFS's online speed correction on.")
@click.option("--in-sample", is_flag=True, help="Each recording calibrated on itself (the ceiling).")
@click.option("--recalibrate", "step", type=Finite(0.0, 1.0, min_open=True), default=None, metavar="STEP",
              help="Recalibrate the quantiles online from earlier first tokens, at this step (the page's: 0.1).")
def coverage(recordings: Path, out: Path, online_speed: bool, in_sample: bool, step: float | None) -> None:
    """Coverage of SFS's TTFT distribution on every vLLM recording in a directory, each scored out of sample.

    RECORDINGS: traces imported with `latroute trace import vllm-record`; each is
    calibrated on a sibling recording of its model and host, or on its own first
    30% of steps (docs/results/coverage.md). Writes OUT (JSON) and prints a line per
    recording.
    """
    refuse_non_utf8({"RECORDINGS": recordings, "OUT": out})
    if not any(p.is_dir() for p in recordings.iterdir()):
        from traces.errors import BadInput

        raise BadInput(recordings, None, "RECORDINGS", "holds no recording (trace import vllm-record output)")
    import json

    from estimators.evaluate.conformal import RecalibrationConfig
    from harness.studies.coverage import print_rows
    from harness.studies.coverage import study as run

    res = run(recordings, online_speed=online_speed, in_sample=in_sample,
              recalibration=RecalibrationConfig(step) if step is not None else None)
    out.write_text(json.dumps(res, indent=1))
    print_rows(res, step, echo=click.echo)


@study.command("route-views")
@click.option("--pool", default="qwen3-h100", show_default=True, help="Built-in pool or pool file of the backends.")
@click.option("--router", default="sfs-cc", show_default=True, help="The one router, under every view.")
@click.option("--views", default="exact,ledger,metrics:100,metrics:1000", show_default=True,
              help="Comma-separated views: exact, ledger, metrics:MS.")
@click.option("--requests", type=COUNT, default=400, show_default=True, help="Requests per run.")
@click.option("--rate", type=POSITIVE, default=8.0, show_default=True, help="Requests per engine second.")
@click.option("--speed", type=Finite(0.01, 100.0), default=2.0, show_default=True,
              help="The backends' clock (latroute serve --speed).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Workload seed.")
@click.option("--repeats", type=IntIn(1, 1000), default=1, show_default=True,
              help="Each view this often, on backends seeded seed + repeat.")
def route_views(pool: str, router: str, views: str, requests: int, rate: float, speed: float, seed: int,
                repeats: int) -> None:
    """What a live router loses with each view: one workload through `latroute route` under each --view."""

    refuse_non_utf8({"--pool": pool})
    require_extra("study route-views", "serve")
    chosen = _views(views, "--views")
    _pool(pool)
    from harness.studies.route_views import study as run

    run(pool, router, chosen, requests, rate, speed, seed, repeats, echo=click.echo)
