"""``latroute calibrate``: fit a batch-time profile from recorded steps."""
from __future__ import annotations

from pathlib import Path

import click

from harness.cli.choices import FORMS, LOSSES
from harness.cli.fleet_options import FLEET_PARAMS, fleet_options, given_fleet_options
from harness.cli.params import FRACTION_OPEN, SEED, EngineSetting, Finite, IntIn, Window, refuse_given, refuse_non_utf8

# The fits and the profile load numba, numpy, pandas and duckdb: imported where a calibration runs, so that
# ``latroute calibrate --help`` does not pay for them (harness.cli.choices holds the form and loss names).


def _pct(v: float) -> str:
    return f"{100 * v:6.2f}%"


def format_results(results: dict, chosen: str | None = None) -> str:
    """The fit of each form (``estimators.timemodel.calibrate.FormResult``), one line each."""
    from estimators.timemodel.features import FORMS as TERMS

    lines = [f"{'form':<5} {'terms':>5} {'held-out MAPE':>14} {'median APE':>11} {'p90 APE':>8} {'R^2':>6} "
             f"{'stall rate':>10} {'train/held-out steps':>21}"]
    for form, r in results.items():
        h = r.holdout
        lines.append(f"{form:<5} {len(TERMS[form]):>5} {_pct(h['mape']):>14} {_pct(h['median_ape']):>11} "
                     f"{_pct(h['p90_ape']):>8} {h['r2']:>6.3f} {_pct(r.train['stall_rate']):>10} "
                     f"{r.train['n']:>10,}/{h['n']:<10,}" + ("  <- chosen" if form == chosen else ""))
    for form, why in getattr(results, "rejected", {}).items():  # forms the steps cannot determine
        lines.append(f"{form:<5} {len(TERMS[form]):>5}   left out: {why}")
    return "\n".join(lines)


def format_profile(p) -> str:
    """A profile's (``estimators.timemodel.profile.BatchTimeProfile``) coefficients, noise and baselines."""
    from estimators.timemodel.features import FORMS as TERMS

    coefs = "  ".join(f"{t.name}={v:.4g}" for t, v in zip(TERMS[p.form], p.coefficients))
    n = p.noise
    lines = [f"coefficients ({p.form}, seconds): {coefs}",
             f"noise: lognormal jitter mu {n.log_mu:+.4f} sigma {n.log_sigma:.4f} (log of actual/typical); "
             f"stalls {100 * n.p_stall:.2f}% of steps adding {n.stall_excess_mean:.2f}x typical on average",
             f"expected step = typical x {p.expected_multiplier:.4f} (top {100 * p.allowance.p_stall:.2f}% of "
             f"residuals as stalls, {p.allowance.excess_mean:.2f}x excess); gap between steps "
             f"{1e3 * p.step_gap_s:.3f} ms"]
    d = p.derived
    if "theta_pre_tokens_per_s" in d or "mean_decode_step_s" in d:
        lines.append(f"baselines: theta_pre {d.get('theta_pre_tokens_per_s', float('nan')):,.0f} tokens/s, "
                     f"mean decode step {1e3 * d.get('mean_decode_step_s', float('nan')):.2f} ms"
                     + (f"; LPS k {d['lps']['k']}, mean service {d['lps']['mean_service_s']:.3f} s, "
                        f"SCV {d['lps']['scv']:.2f}" if d.get("lps") else ""))
    return "\n".join(lines)


@click.command()
@click.argument("traces", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Profile JSON to write.")
@click.option("--force", is_flag=True, help="Replace --out if it exists (only a profile latroute wrote).")
@click.option("--instance", help="Instance whose steps to use (needed when a trace has several).")
@click.option("--form", type=click.Choice([*FORMS, "both"]), default="both", show_default=True,
              help="Model form; 'both' fits each and keeps the lower held-out MAPE.")
@click.option("--holdout", type=FRACTION_OPEN, default=0.2, show_default=True, help="Fraction of steps held out.")
@click.option("--stall-pct", type=Finite(50.0, 100.0, min_open=True, max_open=True), default=99.9, show_default=True,
              help="Percentile of the typical-noise distribution above which a step is a stall.")
@click.option("--loss", type=click.Choice(LOSSES), default="relative", show_default=True,
              help="relative: least squares on residual/time (MAPE is the metric); absolute: on seconds.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the train/held-out split.")
@click.option("--evaluate-on", type=click.Path(path_type=Path), help="Also score the profile on every step of this trace.")
@click.option("--name", help="Profile name (default: the --out file's stem).")
@click.option("--update", "update_ref", metavar="PROFILE",
              help="Refit this profile to the host of TRACES from their steps: the scale from few steps, the whole "
                   "model from many; prints how many steps it takes to come within 1 point of a full refit.")
@click.option("--from-requests", is_flag=True,
              help="TRACES are request-level (measured TTFT, no steps): fit the profile so the twin replaying their "
                   "arrivals reproduces the measured TTFTs and TPOTs.")
@click.option("--engine", "engine_opts", multiple=True, metavar="KEY=VALUE", type=EngineSetting(),
              help="--from-requests: an engine setting the traces do not state (repeatable; see engine_options).")
@click.option("--search-engine", is_flag=True,
              help="--from-requests: also search max_num_batched_tokens and max_num_seqs.")
@click.option("--max-evals", type=IntIn(1, 10**6), default=120, show_default=True,
              help="--from-requests: evaluations (each a twin replay of every trace) per search, at most "
                   "(docs/concepts/request-fit.md).")
@click.option("--jobs", type=IntIn(1, 1024), default=None,
              help="--from-requests: worker processes replaying the traces (default: the cores this process may run "
                   "on); the profile written is the same whatever the number.")
@click.option("--search", "search_opts", multiple=True, metavar="KEY=V1,V2,...", type=EngineSetting(grid=True),
              help="--from-requests: search this engine setting over these values (repeatable; the grid is the "
                   "product; replaces --search-engine's default budget x max_num_seqs grid).")
@click.option("--warm", "warm", multiple=True, type=click.Path(path_type=Path), metavar="TRACE",
              help="--from-requests: this one of TRACES replayed prompts already in the prefix cache (repeatable).")
@click.option("--virtual-engines", type=IntIn(1, 1024), default=1, show_default=True,
              help="--from-requests: vLLM V0 pipeline parallelism (one scheduler per pipeline stage).")
@click.option("--frontend", "frontend", type=click.Choice(["none", "measured"]), default="none", show_default=True,
              help="--from-requests: the API server as one serial queue of admissions and output deliveries "
                   "(harness.requestlevel.frontend); measured = vLLM 0.32's costs per admitted request and per delivered "
                   "token, measured on a real server under bursts.")
@click.option("--frontend-per-request", "frontend_ms", type=Finite(0.0, 1e4), metavar="MS",
              help="--from-requests: the serial front end's cost per admitted request in ms, in [0, 10000] (replaces --frontend's).")
@click.option("--frontend-per-output", "frontend_out_ms", type=Finite(0.0, 1e4), metavar="MS",
              help="--from-requests: the serial front end's cost per delivered token in ms, in [0, 10000] (replaces --frontend's; "
                   "0 = deliveries not modelled).")
@click.option("--frontend-accept-share", "frontend_accept", type=Finite(0.0, 1.0), metavar="SHARE",
              help="--from-requests: the share, in [0, 1], of the per-request cost the front end does for every waiting "
                   "request before handling any (replaces --frontend's; 0 = one FIFO queue).")
@click.option("--fit-window", "fit_window", type=Window(),
              help="--from-requests: fit on the timings of this share of each trace's requests in arrival order "
                   "(0:0.5 = the first half); every request's arrival and lengths are still replayed. "
                   "`validate --score-window 0.5:1` then scores the rest.")
@click.option("--steps-window", "steps_window", type=Window(),
              help="Fit on this share of each trace's steps, in step order (0:0.3 = the first 30%); "
                   "`estimate --score-window 0.3:1` then scores on the rest.")
@click.option("--fit-host", "fit_host", is_flag=True,
              help="--from-requests: also fit the host's part of a step (step_gap_s, the time between steps, and "
                   "host_share, the host's share of a step's time); under async scheduling it overlaps the "
                   "device's (docs/concepts/batch-time.md).")
@fleet_options
def calibrate(traces: tuple[Path, ...], out: Path, force: bool, instance: str | None, form: str, holdout: float, stall_pct: float,
              loss: str, seed: int, evaluate_on: Path | None, name: str | None, update_ref: str | None,
              from_requests: bool, engine_opts: tuple[str, ...], search_engine: bool, max_evals: int,
              jobs: int | None, virtual_engines: int, search_opts: tuple[str, ...], warm: tuple[Path, ...],
              steps_window: tuple[float, float] | None, fit_window: tuple[float, float] | None, frontend: str,
              frontend_ms: float | None,
              frontend_out_ms: float | None, frontend_accept: float | None, fit_host: bool, fleet_pool: Path | None,
              replicas: int | None, assign: str | None, assign_seeds: int) -> None:
    """Fit a batch-time profile from the steps of one or more traces.

    Several traces are pooled. Prints held-out MAPE, median APE, R^2 and the
    stall rate per model form, writes the profile (coefficients, noise model,
    baseline parameters, metrics).

    \b
    Examples:
      latroute trace import vllm-record ../shared/data/vllm_cpu/d1_tinya_poisson_r3 --out d1
      latroute calibrate d1 --out d1.json
      latroute calibrate d1 d2 d4 --form eq9 --evaluate-on d6 --out pooled.json
      latroute calibrate --update d1.json d1c --out d1-on-hostb.json
      latroute calibrate d10 --steps-window 0:0.3 --out d10-head.json   # then: estimate --score-window 0.3:1
      latroute calibrate --from-requests l70-q1 l70-q16 --search-engine --out l70.json
      latroute calibrate --from-requests r4090 --fit-window 0:0.5 --out r4090-h1.json   # validate --score-window 0.5:1
      latroute calibrate --from-requests q4 q8 q12 --replicas 2 --assign round-robin --out fleet.json

    With --from-requests, --replicas N (or --pool FILE) says the logs come
    from N replicas of one model: one profile is fitted, shared by them,
    from the whole fleet's log (its instance_id column's assignment, or
    --assign's over --assign-seeds seeds).
    """
    refuse_non_utf8({"TRACES": traces, "--out": out, "--evaluate-on": evaluate_on, "--update": update_ref,
                     "--warm": warm, "--name": name, "--pool": fleet_pool})
    _refuse_unused(click.get_current_context(), from_requests, update_ref is not None)
    from traces.files.outputs import check_out

    check_out(out, force, kind="file", inputs=[*traces, evaluate_on, update_ref, *warm, fleet_pool])  # before any work
    if from_requests:
        from dataclasses import replace

        from harness.requestlevel.engine_options import parse_search_options
        from harness.requestlevel.fit import calibrate_from_requests
        from harness.requestlevel.fleet import fleet_spec
        from harness.requestlevel.frontend import FrontEnd, measured

        fleet, _ = fleet_spec(fleet_pool, replicas, assign, assign_seeds, given_fleet_options(click.get_current_context()),
                              writes=(str(out), out.name, out.stem, name or out.stem))
        if fleet is not None:
            click.echo(f"fleet: {fleet.replicas} replicas ({fleet.source})"
                       + (f", assignment {fleet.assign} ({fleet.seeds} seed(s)) where a log does not name its instances"
                          if fleet.assign else ""))

        fe = measured() if frontend == "measured" else FrontEnd()
        if frontend_ms is not None:
            fe = replace(fe, per_request_s=frontend_ms / 1e3, source="given (--frontend-per-request)")
        if frontend_out_ms is not None:
            fe = replace(fe, per_output_s=frontend_out_ms / 1e3, output_source="given (--frontend-per-output)")
        if frontend_accept is not None:
            fe = replace(fe, accept_share=frontend_accept, accept_source="given (--frontend-accept-share)")
        calibrate_from_requests(list(traces), out, name, engine_opts, search_engine, max_evals, click.echo,
                                virtual_engines, parse_search_options(search_opts), warm, fe, fit_window, fit_host, fleet,
                                jobs=jobs)
        return
    from estimators.timemodel.calibrate import (
        CalibrationConfig,
        best_form,
        build_profile,
        evaluate_profile,
        fit_forms,
        load_steps,
        noise_check,
    )
    from estimators.timemodel.profile import load_profile

    cfg = CalibrationConfig(forms=tuple(FORMS) if form == "both" else (form,), holdout=holdout, stall_pct=stall_pct,
                            seed=seed, loss=loss, instance=instance)
    data = load_steps(list(traces), instance, steps_window)
    if update_ref is not None:
        _update(load_profile(update_ref), data.steps, out, name, force)
        return
    try:
        results = fit_forms(data.steps, cfg)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    chosen = best_form(results)
    profile = build_profile(name or out.stem, results[chosen], data, cfg)
    click.echo(f"calibrating on {len(data.steps):,} steps of instance {data.sources[0]['instance']} "
               f"from {len(traces)} trace(s), loss {loss}")
    click.echo(format_results(results, chosen if len(results) > 1 else None))
    click.echo(format_profile(profile))
    check = noise_check(profile, data.steps, seed)
    profile.metrics["noise_check"] = check
    click.echo("noise check, actual/typical (recorded vs simulated): " + ", ".join(
        f"{q} {c['recorded']:.3f} vs {c['simulated']:.3f} ({100 * c['rel_diff']:+.1f}%)" for q, c in check.items()))
    if evaluate_on is not None:
        ev = load_steps([evaluate_on], instance)
        metrics = evaluate_profile(profile, ev.steps)
        metrics["trace"] = str(evaluate_on)
        profile.metrics["evaluate_on"] = metrics
        click.echo(f"evaluate on {evaluate_on}: MAPE {_pct(metrics['mape']).strip()}, median APE "
                   f"{_pct(metrics['median_ape']).strip()}, R^2 {metrics['r2']:.3f} over {metrics['n']:,} steps")
    profile.save(out, force=force)
    click.echo(f"wrote {out}")


# options of the request-level fit only, and of the step-level fit only (parameter -> option)
_REQUEST_ONLY = {"engine_opts": "--engine", "search_engine": "--search-engine", "max_evals": "--max-evals",
                 "jobs": "--jobs", "search_opts": "--search", "warm": "--warm", "virtual_engines": "--virtual-engines",
                 "frontend": "--frontend", "frontend_ms": "--frontend-per-request",
                 "frontend_out_ms": "--frontend-per-output", "frontend_accept": "--frontend-accept-share",
                 "fit_window": "--fit-window", "fit_host": "--fit-host", **FLEET_PARAMS}
_STEPS_ONLY = {"update_ref": "--update", "steps_window": "--steps-window", "form": "--form", "holdout": "--holdout",
               "stall_pct": "--stall-pct", "loss": "--loss", "seed": "--seed", "evaluate_on": "--evaluate-on",
               "instance": "--instance"}
_FIT_ONLY = {"form": "--form", "holdout": "--holdout", "stall_pct": "--stall-pct", "loss": "--loss", "seed": "--seed",
             "evaluate_on": "--evaluate-on"}


def _refuse_unused(ctx: click.Context, from_requests: bool, updating: bool) -> None:
    """An option that does nothing in the mode given is refused (before any
    work), not silently ignored: the user meant it to change the result."""
    if from_requests:
        refuse_given(ctx, _STEPS_ONLY, "does nothing with --from-requests (a request-level fit has no steps: it "
                                       "replays the traces' arrivals on the twin); drop one of the two")
    else:
        refuse_given(ctx, _REQUEST_ONLY, "only with --from-requests (a fit from steps reads the engine from the "
                                         "trace and has no front end to model)")
    if updating:
        refuse_given(ctx, _FIT_ONLY, "does nothing with --update (the update rescales or refits the given "
                                     "profile's own form; it holds nothing out and evaluates nothing)")


def _update(profile, steps, out: Path, name: str | None, force: bool = False) -> None:
    """``calibrate --update``: the drift found, the learning curve, the updated profile."""
    from estimators.timemodel.drift import speed_drift
    from estimators.timemodel.rescale import format_curve, learning_curve, update_profile

    click.echo("\n".join(speed_drift(profile, steps).lines()))
    curve = learning_curve(profile, steps) if len(steps) >= 50 else None
    if curve is not None:
        click.echo(format_curve(curve))
    up = update_profile(profile, steps)
    up.profile.name = name or out.stem
    up.profile.fitted_on = {**profile.fitted_on, "updated_from": profile.name, "update_method": up.method,
                            "update_steps": up.steps}
    if curve is not None:
        up.profile.metrics["update_curve"] = curve
    up.profile.save(out, force=force)
    how = f"scaled by {up.scale:.4f}" if up.method == "scale" else "refitted"
    click.echo(f"{profile.name} {how} from {up.steps:,} steps; wrote {out}")
