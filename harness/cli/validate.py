"""``latroute validate``: twin fidelity against a recorded trace."""
from __future__ import annotations

import time
from pathlib import Path

import click

from harness.cli.fleet_options import FLEET_PARAMS, fleet_options, given_fleet_options
from harness.cli.params import SEED, EngineSetting, Window, refuse_given, refuse_non_utf8
from harness.cli.serving_options import parse_serving, served_serving_metrics, serving_options
from harness.cli.windows import WINDOW_HELP
from traces.vllm_releases.versions import unchecked_version_warning

# The twin, the calibration and the trace store load numba, numpy, pandas and duckdb: imported where a
# validation runs, so that ``latroute validate --help`` does not pay for them.


@click.command()
@click.argument("trace_dir", metavar="TRACE", type=click.Path(path_type=Path))
@click.option("--profile", "profile_ref", help="Batch-time profile (path or built-in name).")
@click.option("--calibrate", "self_calibrate", is_flag=True,
              help="Calibrate the profile on TRACE itself (in-sample; prefer a profile from another recording).")
@click.option("--noise", type=click.Choice(["off", "on"]), default="off", show_default=True,
              help="off: every step takes the profile's expected time; on: draw jitter and stalls.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the noise draws.")
@click.option("--join", "join_dir", type=click.Path(path_type=Path),
              help="`latroute trace join` output of this recording: also compare with the client's TTFTs.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for metrics.json etc.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--engine", "engine_opts", multiple=True, metavar="KEY=VALUE", type=EngineSetting(),
              help="Request-level TRACE: an engine setting overriding the profile's fitted engine (repeatable).")
@click.option("--prefix-cache", type=click.Choice(["cold", "warm"]), default="cold", show_default=True,
              help="Request-level TRACE: warm = its prompts were already in the prefix cache (a benchmark re-run "
                   "on the same server).")
@click.option("--score-window", "score_window", type=Window(),
              help="Request-level TRACE: score only this share of its requests in arrival order (0.5:1 = the "
                   "second half); the twin still replays every request (pairs with calibrate --fit-window)" + WINDOW_HELP
                   + ".")
@serving_options
@fleet_options
def validate(trace_dir: Path, profile_ref: str | None, self_calibrate: bool, noise: str, seed: int,
             join_dir: Path | None, out: Path, force: bool, engine_opts: tuple[str, ...], prefix_cache: str,
             score_window: tuple[float, float] | None, percentiles_text: str, goodput_text: str | None,
             fleet_pool: Path | None, replicas: int | None, assign: str | None, assign_seeds: int) -> None:
    """Replay a recorded trace on the engine twin and compare with the recording.

    Same engine configuration, arrival times and instance assignment as the
    recording. Reports per-request TTFT MAPE, median and p90 APE, the step
    count ratio, the prefix-cache hit rate (twin and recorded, with prefix
    caching on), and decision agreement: for every recorded step, does the
    scheduler kernel given the recorded pre-step state choose exactly the
    recorded batch? Writes metrics.json, requests.parquet (per request:
    measured and twin TTFT) and the twin's own trace under twin/.

    \b
    Examples:
      latroute calibrate d2 --out d2.json
      latroute validate d1 --profile d2.json --out val-d1
      latroute validate d1 --calibrate --noise on --seed 3 --out val-d1-noisy
      latroute validate l70-q4 --profile l70.json --out val-q4   # request-level: no steps
      latroute validate r4090 --profile r4090-h1.json --score-window 0.5:1 --out val-h2
      latroute validate q20 --profile fleet.json --out val-q20   # the profile's fleet: 2 replicas, round-robin
      latroute validate q20 --pool fleet-pool.json --out val-q20-pool

    A request-level TRACE (measured TTFT, no steps or instances) is replayed
    with the engine the profile's calibration fitted (``--engine``
    overrides), on the fleet its fit was on unless --replicas or --pool say
    otherwise; it reports how many replicas the run's completions imply and
    replays with that many, the full fleet beside. See
    ``harness.requestlevel.validate``.
    """
    refuse_non_utf8({"TRACE": trace_dir, "--out": out, "--profile": profile_ref, "--join": join_dir,
                     "--pool": fleet_pool})
    from traces.files.outputs import StagedDir, check_out, write_json, write_parquet

    check_out(out, force, inputs=[trace_dir, profile_ref, join_dir, fleet_pool])  # before any work
    if fleet_pool is not None and profile_ref is not None:
        from traces.errors import BadOption

        raise BadOption("--profile", "the pool's entries name their profile: give --pool or --profile, not both")
    if (profile_ref is None and fleet_pool is None) == (not self_calibrate):
        raise click.UsageError("give --profile P.json (or --pool FILE) or --calibrate (exactly one)")
    percentiles, goodput = parse_serving(percentiles_text, goodput_text)
    ctx = click.get_current_context()
    if noise != "on":
        refuse_given(ctx, {"seed": "--seed"}, "only with --noise on (it seeds the noise draws; with noise off "
                                              "every step takes its expected time)")
    import pandas as pd

    from estimators.timemodel.calibrate import CalibrationConfig, best_form, build_profile, fit_forms, load_steps
    from estimators.timemodel.profile import load_profile
    from harness.twin.fidelity.validate import validate as run_validation
    from harness.twin.simulation import write_twin_trace
    from reports.results import result_header
    from reports.serving import format_serving, tidy
    from traces.client_join import client_ttft_check, read_join
    from traces.store import TraceWriter, open_trace

    trace = open_trace(trace_dir)
    if trace.has("instances") or trace.has("steps"):
        refuse_given(ctx, {"engine_opts": "--engine", "prefix_cache": "--prefix-cache", "score_window": "--score-window",
                           **FLEET_PARAMS},
                     f"only for a request-level TRACE: {trace_dir} is a recording, whose steps already fix the "
                     "engine, its prefix cache and the instance of every request")
    joined = read_join(join_dir, trace, trace_dir) if join_dir is not None else None
    if not trace.has("instances") and not trace.has("steps"):
        from harness.requestlevel.fleet import fleet_to_score
        from harness.requestlevel.validate import validate_request_trace

        if self_calibrate:
            raise click.UsageError("a request-level trace has no steps: calibrate --from-requests, then --profile")
        profile = load_profile(profile_ref) if profile_ref is not None else None
        scored = fleet_to_score(profile_ref, profile, fleet_pool, replicas, assign, assign_seeds,
                                given_fleet_options(ctx))
        fleet, frontend, overhead = scored.spec, scored.frontend, scored.frontend_overhead_s
        if scored.pool is not None:
            profile = load_profile(scored.profile_ref)
        validate_request_trace(trace, trace_dir, profile, engine_opts, noise == "on", seed, out,
                               force, click.echo, prefix_cache, score_window, fleet, frontend, overhead)
        return
    if (warning := unchecked_version_warning(trace.meta)) is not None:
        click.echo(warning, err=True)
    if self_calibrate:
        data = load_steps([trace_dir])
        cfg = CalibrationConfig()
        results = fit_forms(data.steps, cfg)
        profile = build_profile(f"{trace_dir.name}-self", results[best_form(results)], data, cfg)
    else:
        profile = load_profile(profile_ref)
    t = time.perf_counter()
    v = run_validation(trace, profile, noise == "on", seed)
    m = v.metrics
    m["wall_s"] = time.perf_counter() - t
    if join_dir is not None:
        m["client"] = client_ttft_check(v.per_request, joined)
    with StagedDir(out, force) as tmp:
        write_parquet(tmp / "requests.parquet", v.per_request)
        with TraceWriter(tmp / "twin") as w:
            w.meta["source"] = {"kind": "twin", "replay_of": str(trace_dir), "profile": profile.name,
                                "noise": noise, "seed": seed}
            w.meta["arrivals"] = "measured"
            write_twin_trace(w, v.twin)
        # vLLM-style serving metrics of the recording and of the twin's replay of it, side by side
        m["serving"] = {"recorded": served_serving_metrics(trace_dir, trace.read("requests"), percentiles, goodput)}
        m["serving"]["twin"] = served_serving_metrics(tmp / "twin", open_trace(tmp / "twin").read("requests"),
                                                      percentiles, goodput)
        write_json(tmp / "metrics.json", {**result_header("validate"), **m})
        write_parquet(tmp / "metrics.parquet", pd.concat([tidy(s, source=k) for k, s in m["serving"].items()],
                                                         ignore_index=True))
    tt, st, da = m["ttft"], m["steps"], m["decision_agreement"]
    click.echo(f"validate {trace_dir} with profile {profile.name} ({profile.form}), noise {noise}")
    click.echo(f"TTFT        MAPE {100 * tt['mape']:.1f}%  median APE {100 * tt['median_ape']:.1f}%  "
               f"p90 APE {100 * tt['p90_ape']:.1f}%  over {tt['n']} requests "
               f"(mean {m['ttft_mean_s']['recorded']:.3f} s recorded, {m['ttft_mean_s']['twin']:.3f} s twin)")
    click.echo(f"steps       {st['twin']:,} twin / {st['recorded']:,} recorded = {st['ratio']:.3f}")
    if da["steps"]:
        click.echo(f"decisions   {da['agree']:,} of {da['steps']:,} recorded steps reproduced exactly "
                   f"({100 * da['rate']:.2f}%)")
    for d in m.get("drift", {}).values():
        if d["classes"]:
            c = d["classes"]["all"]
            click.echo(f"host speed  factor {c['factor']:.3f} (95% CI {c['ci_low']:.3f}-{c['ci_high']:.3f}) against "
                       f"{d['profile']}" + ("  DRIFT: the profile does not match this host" if d["drift"] else ""))
    for k, sm in m["serving"].items():
        click.echo(f"serving ({k}):\n  " + format_serving(sm).replace("\n", "\n  "))
    if join_dir is not None and m["client"]["n"]:
        c = m["client"]
        click.echo(f"client      TTFT - engine TTFT median {c['overhead']['median_ms']:.2f} ms, p90 "
                   f"{c['overhead']['p90_ms']:.2f} ms; twin vs client TTFT MAPE {100 * c['twin_vs_client_mape']:.1f}% "
                   f"(+ median overhead: {100 * c['twin_plus_median_overhead_vs_client_mape']:.1f}%)")
    if "hit_rate" in m:
        hr = m["hit_rate"]
        click.echo(f"prefix hits {100 * hr['twin']:.1f}% of prompt tokens twin"
                   + (f" / {100 * hr['recorded']:.1f}% recorded" if hr["recorded"] is not None else ""))
    click.echo(f"wrote {out}")
