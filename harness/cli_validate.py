"""``latroute validate``: twin fidelity against a recorded trace."""
from __future__ import annotations

import time
from pathlib import Path

import click

from estimators.calibrate import CalibrationConfig, best_form, build_profile, fit_forms, load_steps
from estimators.profile import load_profile
from harness.twin import write_twin_trace
from harness.validate import validate as run_validation
from traces.store import StagedDir, TraceWriter, open_trace, write_json, write_parquet


@click.command()
@click.argument("trace_dir", metavar="TRACE", type=click.Path(path_type=Path))
@click.option("--profile", "profile_ref", help="Batch-time profile (path or built-in name).")
@click.option("--calibrate", "self_calibrate", is_flag=True,
              help="Calibrate the profile on TRACE itself (in-sample; prefer a profile from another recording).")
@click.option("--noise", type=click.Choice(["off", "on"]), default="off", show_default=True,
              help="off: every step takes the profile's expected time; on: draw jitter and stalls.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the noise draws.")
@click.option("--out", required=True, type=click.Path(path_type=Path), help="Directory for metrics.json etc.")
@click.option("--force", is_flag=True, help="Replace --out if it exists.")
def validate(trace_dir: Path, profile_ref: str | None, self_calibrate: bool, noise: str, seed: int, out: Path,
             force: bool) -> None:
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
    """
    if (profile_ref is None) == (not self_calibrate):
        raise click.UsageError("give --profile P.json or --calibrate (exactly one)")
    trace = open_trace(trace_dir)
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
    with StagedDir(out, force) as tmp:
        write_json(tmp / "metrics.json", m)
        write_parquet(tmp / "requests.parquet", v.per_request)
        with TraceWriter(tmp / "twin") as w:
            w.meta["source"] = {"kind": "twin", "replay_of": str(trace_dir), "profile": profile.name,
                                "noise": noise, "seed": seed}
            w.meta["arrivals"] = "measured"
            write_twin_trace(w, v.twin)
    tt, st, da = m["ttft"], m["steps"], m["decision_agreement"]
    click.echo(f"validate {trace_dir} with profile {profile.name} ({profile.form}), noise {noise}")
    click.echo(f"TTFT        MAPE {100 * tt['mape']:.1f}%  median APE {100 * tt['median_ape']:.1f}%  "
               f"p90 APE {100 * tt['p90_ape']:.1f}%  over {tt['n']} requests "
               f"(mean {m['ttft_mean_s']['recorded']:.3f} s recorded, {m['ttft_mean_s']['twin']:.3f} s twin)")
    click.echo(f"steps       {st['twin']:,} twin / {st['recorded']:,} recorded = {st['ratio']:.3f}")
    if da["steps"]:
        click.echo(f"decisions   {da['agree']:,} of {da['steps']:,} recorded steps reproduced exactly "
                   f"({100 * da['rate']:.2f}%)")
    if "hit_rate" in m:
        hr = m["hit_rate"]
        click.echo(f"prefix hits {100 * hr['twin']:.1f}% of prompt tokens twin"
                   + (f" / {100 * hr['recorded']:.1f}% recorded" if hr["recorded"] is not None else ""))
    click.echo(f"wrote {out}")
