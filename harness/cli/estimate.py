"""``latroute estimate``: score TTFT estimators against measured TTFT."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from harness.cli.choices import (
    ESTIMATORS,
    KNOWN_ESTIMATORS,
    LEARNED_MIN_SAMPLES,
    LEARNED_RETRAIN_EVERY_S,
    LEARNED_WINDOW,
    LENGTH_POLICIES,
    RECALIBRATION_STEP,
    SPEED_HALF_LIFE_STEPS,
)
from harness.cli.extras import require_extra
from harness.cli.fleet_options import FLEET_PARAMS, fleet_options, given_fleet_options
from harness.cli.params import (
    AT_LEAST_1,
    NON_NEGATIVE,
    POSITIVE,
    EngineSetting,
    IntIn,
    Window,
    refuse_given,
    refuse_non_utf8,
)
from harness.cli.plugin_options import isolation_options, plugin_timeout
from harness.cli.replay_options import SLO_HELP, SloPolicy
from harness.cli.windows import WINDOW_HELP, check_step_window
from traces.errors import BadInput, BadOption

# The estimators, the profile and the trace store load numba, numpy, pandas and duckdb: imported where an
# estimate runs, so that ``latroute estimate --help`` does not pay for them (harness.cli.choices holds the
# names and defaults its options show).

def _models(trace, profile_ref: str | None, calibrate_on: Path | None, needs_baselines: bool):
    """Each instance's (profile, baseline parameters) of ``trace`` (a ``traces.store.Trace``)."""
    from estimators.estimate import BaselineParams
    from estimators.timemodel.calibrate import calibrate_instance
    from estimators.timemodel.profile import load_profile
    from traces.store import open_trace

    instances = trace.read("instances")
    ids = list(instances["instance_id"].astype(str))
    models = {}
    for inst in ids:
        if profile_ref is not None:
            prof = load_profile(profile_ref)
        elif calibrate_on is not None:
            other = open_trace(calibrate_on)
            other_ids = list(other.read("instances")["instance_id"].astype(str)) if other.has("instances") else []
            src = inst if inst in other_ids else (other_ids[0] if len(other_ids) == 1 else None)
            if src is None:
                raise BadInput(calibrate_on, None, "instance_id", f"has no instance {inst!r} to calibrate on")
            prof = calibrate_instance(calibrate_on, src)
        else:
            ref = instances.set_index("instance_id").loc[inst, "profile"]
            if not isinstance(ref, str) or not ref:
                raise click.UsageError("give --profile or --calibrate-on (the trace names no profile for "
                                       f"instance {inst})")
            prof = load_profile(ref)
        params = None
        if needs_baselines:
            try:
                params = BaselineParams.from_derived(prof.derived)
            except ValueError as e:
                raise click.UsageError(f"profile {prof.name}: {e}; use --calibrate-on or "
                                       "--estimators sfs") from None
        models[inst] = (prof, params)
    return models


def _train_on(path: Path):
    """The recording (``traces.store.Trace``) ``--train-on`` names, checked before any work: it needs measured
    TTFTs and steps."""
    from traces.store import open_trace

    other = open_trace(path)
    for table in ("requests", "steps", "step_items", "instances"):
        if not other.has(table):
            raise BadInput(other.file(table), None, table, "--train-on needs a recording with this table")
    if "ttft_s" not in other.columns("requests"):
        raise BadInput(other.file("requests"), None, "ttft_s", "--train-on needs measured TTFTs")
    return other


def _slo_scores(trace, policy: str, estimates) -> dict:
    """Each request's SLO under ``policy`` (the rule seeded 0) and each
    estimator's calls of it (``traces.policies.slo.slo_calls``)."""
    from traces.policies.slo import slo_calls, slo_targets

    have = trace.columns("requests")
    reqs = trace.read("requests", [c for c in ("request_id", "prompt_tokens", "slo_ttft_s") if c in have])
    targets = slo_targets(reqs, policy, 0)
    return {**targets.record(), "estimators": slo_calls(estimates, reqs["request_id"].to_numpy(), targets.seconds)}


def format_metrics(m: dict, coinciding: set[str] = frozenset()) -> str:
    """The estimate's summary lines; ``coinciding``: estimators whose
    predicted quantiles coincide on every request (``coinciding_quantiles``)."""
    lines = [f"{'estimator':<11} {'n':>6} {'MAPE':>8} {'median APE':>11} {'p90 APE':>8} {'p99 APE':>8} "
             f"{'mean us':>9} {'median us':>10}"]
    for name, s in m["estimators"].items():
        lines.append(f"{name:<11} {s['n']:>6} {100 * s['mape']:7.1f}% {100 * s['median_ape']:10.1f}% "
                     f"{100 * s['p90_ape']:7.1f}% {100 * s['p99_ape']:7.1f}% {s['mean_us']:9.1f} "
                     f"{s['median_us']:10.1f}")
    for name, s in m["estimators"].items():
        c, raw = s.get("coverage"), s.get("coverage_raw")
        if c:
            what = "recalibrated " if raw else ""
            why = ("; they coincide: the profile has no noise model (a request-level profile, from calibrate "
                   "--from-requests, carries none), so every predicted quantile is the point estimate"
                   if name in coinciding else "")
            lines.append(f"{name} coverage (share of measured TTFTs below the {what}predicted quantile, n {c['n']}): "
                         f"p50 {100 * c['p50']:.1f}%, p90 {100 * c['p90']:.1f}%, p99 {100 * c['p99']:.1f}% "
                         f"(nominal 50/90/99{why})")
        if raw:
            lines.append(f"{name} coverage before recalibration: p50 {100 * raw['p50']:.1f}%, "
                         f"p90 {100 * raw['p90']:.1f}%, p99 {100 * raw['p99']:.1f}%")
    for name, s in m["estimators"].items():
        pb = s.get("pinball_s")
        if pb and pb.get("p50") is not None:
            lines.append(f"{name} pinball loss: p50 {1e3 * pb['p50']:.2f} ms, p90 {1e3 * pb['p90']:.2f} ms")
        tr = s.get("training")
        if tr:
            fit = "no fit" if tr["mean_fit_ms"] is None else f"{tr['mean_fit_ms']:.1f} ms per fit"
            lines.append(f"{name} training: {tr['fits']} fits of <= {tr['window']} samples every "
                         f"{tr['retrain_every_s']:g} s ({fit}, {tr['amortised_fit_us_per_estimate'] or 0:.1f} us "
                         f"per estimate amortised, in the mean us above); cold start (throughput) answered "
                         f"{100 * (tr['cold_start_share'] or 0):.1f}% of estimates")
            for src, b in tr["by_source"].items():
                if b.get("n"):
                    lines.append(f"  {name} from {src}: n {b['n']}, MAPE {100 * b['mape']:.1f}%, "
                                 f"p90 APE {100 * b['p90_ape']:.1f}%")
    a = m.get("sfs_attribution")
    if a:
        lines.append(f"SFS error split: trajectory {100 * a['trajectory_error']:.1f}% (simulation and lengths), "
                     f"time model {100 * a['time_model_error']:.1f}% (batch-time model and step jitter); "
                     f"{a['mean_sim_steps']:.1f} simulated vs {a['mean_real_steps']:.1f} real steps per query")
        if "jitter_floor_mape" in a:
            lines.append(f"jitter floor: a perfect trajectory charged expected times would still be "
                         f"{100 * a['jitter_floor_mape']:.1f}% off TTFTs drawn from the profile's noise model")
    return "\n".join(lines)


@click.command()
@click.argument("trace_dir", metavar="TRACE", type=click.Path(path_type=Path))
@click.option("--estimators", "names", default=",".join(ESTIMATORS), show_default=True,
              help=f"Comma-separated estimators, of: {', '.join(KNOWN_ESTIMATORS)} (latroute list estimators), or "
                   "plug-ins as module:Class. learned (llm-d's online-trained LightGBM model) needs the "
                   "learned extra and is not in the default list.")
@click.option("--lengths", metavar="|".join(LENGTH_POLICIES),
              help="Predicted output lengths of residents. Default: column (predicted_output_tokens) if the trace "
                   "has it, else median (of the trace's output lengths); oracle = true lengths (a bound).")
@click.option("--slo", "slo_policy", type=SloPolicy(),
              help="Also score how each estimator calls every request's TTFT SLO (on time or late, as a "
                   "latency-aware router decides): the trace's slo_ttft_s (column), the paper's rule (seed 0), "
                   f"{SLO_HELP}, or none. Default: not scored.")
@click.option("--profile", "profile_ref", help="Batch-time profile (path or built-in name) for every instance.")
@click.option("--calibrate-on", type=click.Path(path_type=Path),
              help="Calibrate each instance's profile on this other trace's steps.")
@click.option("--ewma-tau", type=POSITIVE, default=10.0, show_default=True,
              help="Time constant (s) of the online arrival-rate estimate used by lps-mg.")
@click.option("--online-speed", type=click.Choice(["on", "off"]), default="off", show_default=True,
              help="Scale each profile by the host speed learned from the steps completed before each query "
                   "(every estimator alike).")
@click.option("--speed-half-life", type=AT_LEAST_1, default=SPEED_HALF_LIFE_STEPS, show_default=True,
              help="Half-life, in completed steps, of the online speed factor.")
@click.option("--recalibrate", type=click.Choice(["on", "off"]), default="off", show_default=True,
              help="Recalibrate each distribution's quantiles online from the measured TTFTs of requests whose "
                   "first token came before each arrival (estimators.evaluate.conformal); the model's own are kept "
                   "as p50_raw_s..p99_raw_s.")
@click.option("--recalibration-step", type=POSITIVE, default=RECALIBRATION_STEP, show_default=True,
              help="Step (log time) of the online recalibration's quantile offsets.")
@click.option("--retrain-every", type=NON_NEGATIVE, default=LEARNED_RETRAIN_EVERY_S, show_default=True,
              help="learned: seconds (of the trace's clock) between refits (llm-d's example deployment: 1; its "
                   "code's default: 1800).")
@click.option("--window", type=IntIn(LEARNED_MIN_SAMPLES, 1_000_000), default=LEARNED_WINDOW, show_default=True,
              help="learned: the newest labelled samples a refit trains on (llm-d's example deployment: 100).")
@click.option("--train-on", type=click.Path(path_type=Path),
              help="learned: first train its model on this other recording's measured requests (e.g. another "
                   "host's), then carry it into TRACE instead of starting from the cold start.")
@click.option("--cache-blind", is_flag=True,
              help="Ignore the instances' prefix cache (SFS computes every prompt token): what ignoring it costs.")
@click.option("--cache-aware", is_flag=True,
              help="Baselines (throughput, lps, lps-mg) count only prompt tokens the prefix cache does not hold.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for the results.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
@click.option("--engine", "engine_opts", multiple=True, metavar="KEY=VALUE", type=EngineSetting(),
              help="Request-level TRACE: an engine setting overriding the profile's fitted engine (repeatable).")
@click.option("--prefix-cache", type=click.Choice(["cold", "warm"]), default="cold", show_default=True,
              help="Request-level TRACE: warm = its prompts were already in the prefix cache.")
@click.option("--score-window", type=Window(),
              help="Score only requests arriving within this share of each instance's steps, in step order "
                   "(0.3:1 = after the first 30%, as fitted by `calibrate --steps-window 0:0.3`)" + WINDOW_HELP + ".")
@click.option("--join", "join_dir", type=click.Path(path_type=Path),
              help="`latroute trace join` output of this recording: also score each estimator against the "
                   "client's TTFTs (as is and plus the run's median measured API overhead).")
@fleet_options
@isolation_options
def estimate(trace_dir: Path, names: str, lengths: str, slo_policy: str | None, profile_ref: str | None,
             calibrate_on: Path | None,
             ewma_tau: float, online_speed: str, speed_half_life: float, recalibrate: str,
             recalibration_step: float, retrain_every: float, window: int, train_on: Path | None,
             cache_blind: bool, cache_aware: bool, out: Path, force: bool,
             engine_opts: tuple[str, ...], prefix_cache: str, score_window: tuple[float, float] | None,
             join_dir: Path | None, fleet_pool: Path | None, replicas: int | None, assign: str | None,
             assign_seeds: int, isolate_plugins: bool, plugin_timeout_s: float | None) -> None:
    """Estimate every measured request's TTFT with each estimator, from
    honest snapshots of its instance at arrival, and score them.

    Writes estimates.parquet (request_id, instance_id, estimator, true_s,
    est_s, residents, waiting, est_us), attribution.parquet (SFS: reference
    charge on the real trajectory) and metrics.json (MAPE, median/p90/p99
    APE, n, µs per estimate, by load bin, SFS error split).

    \b
    Examples:
      latroute estimate d1 --calibrate-on d2 --out est-d1
      latroute estimate d1 --profile d2.json --lengths median --estimators sfs,throughput --out est-d1-median
      latroute estimate served --out est-twin        # twin traces name their instances' profiles
      latroute estimate l70-q4 --profile l70.json --out est-q4   # request-level: reconstructed snapshots
      latroute estimate d10 --profile d10-head.json --score-window 0.3:1 --out est-d10-rest
      latroute estimate rec --profile d1.json --join join --out est-rec   # + error against client TTFTs
      latroute estimate served --slo constant:500 --out est-slo   # + each estimator's on-time calls

    A request-level TRACE (no steps) is first replayed on the twin with the
    --profile (from calibrate --from-requests) and the estimators read the
    twin's reconstructed states, scored against the measured TTFTs. On a
    fleet (the profile's fit's, --replicas or --pool) each distinct
    assignment of its seeds is reconstructed and scored: the first one's
    estimates are written, the MAPE's min/median/max over all reported.
    """
    chosen = tuple(n.strip() for n in names.split(",") if n.strip())
    if "learned" in chosen:  # before anything else: without LightGBM the learned estimator cannot run
        require_extra("estimate --estimators learned", "learned")
    refuse_non_utf8({"TRACE": trace_dir, "--out": out, "--profile": profile_ref, "--calibrate-on": calibrate_on,
                     "--join": join_dir, "--train-on": train_on, "--pool": fleet_pool})
    from traces.files.outputs import StagedDir, check_out, write_json, write_parquet

    check_out(out, force, inputs=[trace_dir, profile_ref, calibrate_on, fleet_pool])  # before any work
    isolate_s = plugin_timeout(isolate_plugins, plugin_timeout_s)
    unknown = [n for n in chosen if n not in KNOWN_ESTIMATORS and ":" not in n]  # module:Class = a plug-in
    if unknown or not chosen:
        raise click.BadParameter(f"unknown estimator {unknown[0] if unknown else '(none)'} "
                                 f"(choose from {', '.join(KNOWN_ESTIMATORS)})", param_hint="--estimators")
    import numpy as np

    from estimators.estimate import EstimateConfig, check_plugin_estimator, coinciding_quantiles, estimate_trace
    from estimators.evaluate.conformal import RecalibrationConfig
    from estimators.learned.model import LearnedConfig
    from estimators.timemodel.drift import trace_drift
    from estimators.timemodel.online_speed import OnlineSpeedConfig
    from reports.results import result_header
    from reports.serving import tidy_estimates
    from traces.policies.lengths import check_length_policy
    from traces.store import open_trace

    for name in chosen:
        if ":" in name and isolate_s is None:  # foreign code: loaded and checked before any work or output
            check_plugin_estimator(name)  # (isolated: only ever loaded in its own process, which checks it there)
    if profile_ref is not None and calibrate_on is not None:
        raise click.UsageError("give --profile or --calibrate-on, not both")
    try:
        check_length_policy(lengths)
    except ValueError as e:
        raise BadOption("--lengths", str(e)) from None
    ctx = click.get_current_context()
    if online_speed != "on":
        refuse_given(ctx, {"speed_half_life": "--speed-half-life"}, "only with --online-speed on (it is the "
                                                                    "online speed factor's half-life)")
    if recalibrate != "on":
        refuse_given(ctx, {"recalibration_step": "--recalibration-step"}, "only with --recalibrate on")
    if "learned" not in chosen:
        refuse_given(ctx, {"retrain_every": "--retrain-every", "window": "--window", "train_on": "--train-on"},
                     "only with the learned estimator (its online training)")
    if "lps-mg" not in chosen:
        refuse_given(ctx, {"ewma_tau": "--ewma-tau"}, "only with the lps-mg estimator (the only one using the "
                                                      "online arrival-rate estimate)")
    trace = open_trace(trace_dir)
    if slo_policy == "column" and "slo_ttft_s" not in trace.columns("requests"):
        raise BadOption("--slo", f"column needs a slo_ttft_s column; {trace_dir} has none (use rule, constant:MS "
                                 "or none)")
    recon = None
    recons: list = []
    if trace.has("steps") or trace.has("instances"):
        refuse_given(ctx, {"engine_opts": "--engine", "prefix_cache": "--prefix-cache", **FLEET_PARAMS},
                     f"only for a request-level TRACE: {trace_dir} is a recording, whose steps already fix the "
                     "engine, its prefix cache and the instance of every request")
    if fleet_pool is not None and (profile_ref is not None or calibrate_on is not None):
        raise BadOption("--profile" if profile_ref is not None else "--calibrate-on",
                        "the pool's entries name their profile: give --pool or a profile, not both")
    joined = None
    if join_dir is not None:
        from traces.client_join import read_join

        joined = read_join(join_dir, trace, trace_dir)
    if not trace.has("steps") and not trace.has("instances"):
        from estimators.timemodel.profile import load_profile
        from harness.requestlevel.fleet import fleet_to_score
        from harness.requestlevel.reconstruct import reconstruct_for_estimate

        fitted = load_profile(profile_ref) if profile_ref is not None else None
        scored = fleet_to_score(profile_ref, fitted, fleet_pool, replicas, assign, assign_seeds,
                                given_fleet_options(ctx))
        profile_ref, fleet, frontend, fe_overhead = (scored.profile_ref, scored.spec, scored.frontend,
                                                     scored.frontend_overhead_s)
        recons = reconstruct_for_estimate(trace, trace_dir, profile_ref, engine_opts, prefix_cache, fleet, frontend,
                                          fe_overhead)
        recon = recons[0]
        trace = recon.trace
    if lengths == "column" and "predicted_output_tokens" not in trace.columns("requests"):
        raise BadOption("--lengths", f"column needs a predicted_output_tokens column; {trace_dir} has none "
                                     "(use median or constant:N)")
    for table in ("requests", "steps", "step_items", "instances"):
        if not trace.has(table):
            raise BadInput(trace.file(table), None, table, "estimate needs this table (a recorded or twin trace)")
    check_step_window(trace, score_window)
    carry = _train_on(train_on) if train_on is not None else None
    models = _models(trace, profile_ref, calibrate_on, needs_baselines=any(n != "sfs" for n in chosen))
    overhead = float(trace.meta.get("frontend_overhead_s", 0.0) or 0.0)
    speed_cfg = OnlineSpeedConfig(half_life_steps=speed_half_life) if online_speed == "on" else None
    cfg = EstimateConfig(estimators=chosen, lengths=lengths, ewma_tau_s=ewma_tau, frontend_overhead_s=overhead,
                         online_speed=speed_cfg, cache_blind=cache_blind, cache_aware=cache_aware,
                         score_window=score_window,
                         recalibration=RecalibrationConfig(recalibration_step) if recalibrate == "on" else None,
                         learned=LearnedConfig(retrain_every_s=retrain_every, window=window), learned_train_on=carry,
                         plugin_timeout_s=isolate_s)
    drift = trace_drift(trace, {i: p for i, (p, _) in models.items()})
    n_req = trace.meta.get("tables", {}).get("requests", 0)
    t = time.perf_counter()
    try:
        if sys.stderr.isatty() and n_req > 2000:
            with click.progressbar(length=n_req, label="estimating", file=sys.stderr) as bar:
                res = estimate_trace(trace, models, cfg, progress=bar.update)
        else:
            res = estimate_trace(trace, models, cfg)
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    m = res.metrics
    m.update({"trace": str(trace_dir), "ewma_tau_s": ewma_tau, "cache_blind": cache_blind,
              "cache_aware": cache_aware,
              "online_speed": None if speed_cfg is None else {"half_life_steps": speed_half_life},
              "drift": {i: d.to_json() for i, d in drift.items()},
              "profiles": {i: {"name": p.name, "form": p.form} for i, (p, _) in models.items()},
              "wall_s": time.perf_counter() - t})
    if train_on is not None:
        m["learned_trained_on"] = str(train_on)
    if recon is not None:
        m["snapshots"] = {"kind": "reconstructed", "note": recon.note}
        m["engine_marks"], m["caveats"] = recon.engine_marks, recon.caveats
    if len(recons) > 1:  # a fleet's other assignments: scored too, for the spread (their estimates are not written)
        runs = [m] + [estimate_trace(r.trace, _models(r.trace, profile_ref, None, needs_baselines=any(
            n != "sfs" for n in chosen)), cfg).metrics for r in recons[1:]]
        m["assign_seeds"] = {"reconstructions": len(runs), "notes": [r.note for r in recons], "estimators": {
            name: {k: [float(np.min(v)), float(np.median(v)), float(np.max(v))]
                   for k in ("mape", "median_ape", "p90_ape")
                   for v in [np.array([r["estimators"][name][k] for r in runs], dtype=np.float64)]}
            for name in m["estimators"]}}
    if slo_policy is not None:
        m["slo"] = _slo_scores(trace, slo_policy, res.estimates)
    if join_dir is not None:
        from traces.client_join import client_estimate_check

        m["client"] = client_estimate_check(res.estimates, joined)
    with StagedDir(out, force) as tmp:
        write_parquet(tmp / "estimates.parquet", res.estimates)
        write_parquet(tmp / "attribution.parquet", res.attribution)
        write_json(tmp / "metrics.json", {**result_header("estimate"), **m})
        write_parquet(tmp / "metrics.parquet", tidy_estimates(m))
    note = m["policies"]["lengths"]["note"]
    if m["policies"]["lengths"]["oracle"]:
        click.echo(note, err=True)
    click.echo(f"estimate {trace_dir}: {m['requests']} requests, profiles "
               + ", ".join(f"{i}={p['name']}" for i, p in m["profiles"].items()))
    click.echo(note)
    if recon is not None:
        from harness.requestlevel.engine_options import marks_summary

        click.echo(recon.note)
        click.echo("\n".join(marks_summary(recon.engine_marks, recon.caveats)))
    click.echo(format_metrics(m, coinciding_quantiles(res.estimates)))
    if "assign_seeds" in m:
        a = m["assign_seeds"]
        click.echo(f"over the fleet's {a['reconstructions']} distinct assignments (min/median/max MAPE; the first's "
                   "estimates written): " + "  ".join(f"{name} " + "/".join(f"{100 * x:.1f}" for x in e["mape"]) + "%"
                                                     for name, e in a["estimators"].items()))
    for d in drift.values():
        click.echo("\n".join(d.lines()))
    if speed_cfg is not None:
        click.echo(f"online speed correction on (half-life {speed_half_life:g} completed steps)")
    if cfg.recalibration is not None:
        click.echo(f"online recalibration of the quantiles on (step {recalibration_step:g}; learned from the "
                   "measured TTFTs of requests whose first token came before each arrival)")
    if "slo" in m:
        click.echo(m["slo"]["note"] + "; each estimator's call of it (estimate vs measured TTFT on the same side):")
        for name, c in m["slo"]["estimators"].items():
            click.echo(f"  {name:<10} right {100 * c['right']:.1f}% of {c['n']}; of {c['late']} late, "
                       f"{100 * c['late_called_on_time']:.1f}% called on time; of the on-time, "
                       f"{100 * c['on_time_called_late']:.1f}% called late")
    for name, c in (m.get("client") or {}).items():
        if c["n"]:
            o = c["overhead"]
            click.echo(f"{name} vs client TTFT ({c['n']} joined requests): MAPE {100 * c['vs_client_mape']:.1f}%, "
                       f"{100 * c['plus_median_overhead_vs_client_mape']:.1f}% with the median measured API "
                       f"overhead ({o['median_ms']:.2f} ms) added")
    click.echo(f"wrote {out}")
