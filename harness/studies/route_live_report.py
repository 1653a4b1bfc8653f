"""The live study's report and diagnosis (``harness.studies.route_live``):
the table of measured against predicted OnTimeUtility with rankings,
Kendall's tau and the verdict, and where a real study's prediction error
comes from (profile, front end, view), with numbers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from harness.studies.live_servers import latroute_cmd, run_checked
from harness.studies.rank_agreement import interval, verdict


def engine_ttfts(rec: Path) -> pd.DataFrame:
    """A recording's requests: the id the client sent, and the engine's TTFT."""
    return pd.read_csv(rec / "requests.csv", usecols=["client_id", "ttft_s"])


def report(out: Path, tolerance: float = 0.15) -> str:
    res = json.loads((out / "results.json").read_text())
    runs = pd.DataFrame(res["runs"])
    routers = list(res["predicted"])
    meas = {r: interval(runs.loc[runs["router"] == r, "ontime_utility"]) for r in routers}
    pred = {r: res["predicted"][r]["ontime_utility"] for r in routers}
    v = verdict(meas, pred, tolerance)
    lines = [f"{res.get('title', out.name)}", "",
             "| router | measured OnTimeUtility (mean [95% interval]; repeats) | predicted (seeds' range) | "
             "relative error | "
             "SLO attainment meas. / pred. | TTFT p50 meas. / pred., ms | TTFT p90 meas. / pred., ms | "
             "shares meas. / pred. |", "|---|---|---|---|---|---|---|---|"]
    for r in routers:
        g, p, m = runs[runs["router"] == r], res["predicted"][r], meas[r]
        shares = " ".join(f"{k} {np.mean([s[k] for s in g['share_by_instance']]):.2f}/{p['share_by_instance'][k]:.2f}"
                          for k in p["share_by_instance"])
        lines.append(f"| {r} | {m.mean:.4f} [{m.lo:.4f}, {m.hi:.4f}]; "
                     f"{', '.join(f'{x:.4f}' for x in g['ontime_utility'])} | {pred[r]:.4f} "
                     f"({min(p['ontime_utility_seeds']):.4f}-{max(p['ontime_utility_seeds']):.4f}) | "
                     f"{100 * v['relative_error'][r]:+.1f}% | {g['slo_attainment'].mean():.3f} / "
                     f"{p['slo_attainment']:.3f} | {1e3 * g['ttft_p50_s'].mean():.0f} / {1e3 * p['ttft_p50_s']:.0f} | "
                     f"{1e3 * g['ttft_p90_s'].mean():.0f} / {1e3 * p['ttft_p90_s']:.0f} | {shares} |")
    lines += ["", f"measured ranking: {' > '.join(v['measured_ranking'])}",
              f"predicted ranking: {' > '.join(v['predicted_ranking'])}",
              f"Kendall's tau: {v['kendall_tau']:.3f}"]
    for d in v["disagreements"]:
        lines.append(f"disagreeing pair: {d['better_measured']} > {d['worse_measured']} measured "
                     f"(+{d['measured_diff']:.4f}), predicted {d['predicted_diff']:+.4f}: "
                     f"{'separated by the repeats' if d['separated'] else 'inside the repeats interval'}")
    lines.append(f"every router within {100 * tolerance:.0f}%: {v['all_within_tolerance']}; rankings agree "
                 f"except pairs inside the repeats' interval: {v['rankings_agree_within_noise']}")
    if "proxy_cpu_s" in runs:
        share = (runs["proxy_cpu_s"] + runs["loadgen_cpu_s"]) / runs["wall_s"]
        lines.append(f"proxy + loadgen CPU: {100 * share.mean():.1f}% of one core on average (max "
                     f"{100 * share.max():.1f}%; proxy alone {100 * (runs['proxy_cpu_s'] / runs['wall_s']).mean():.1f}%)")
    loads = runs[["load_before", "load_after"]]
    lines.append(f"load average during the runs: {loads.min().min():.1f}-{loads.max().max():.1f}")
    (out / "verdict.json").write_text(json.dumps(v, indent=1))
    return "\n".join(lines)


def _validate_session(out: Path, session: Path, name: str, profile: str):
    """One server's session recording on the twin (``latroute validate``):
    its table row and the recorded requests (client id, engine TTFT)."""

    rec, t, v = session / f"rec-{name}", session / f"{name}.t", session / f"val-{name}"
    if not (rec / "requests.csv").is_file():
        return None
    if not t.is_dir():
        run_checked(latroute_cmd("trace", "import", "vllm-record", rec, "--out", t, "--force"), out, 600)
    if not (v / "metrics.json").is_file():
        run_checked(latroute_cmd("validate", t, "--profile", profile, "--out", v, "--force"), out, 1200)
    m = json.loads((v / "metrics.json").read_text())
    row = (f"| {session.name} {name} | {100 * m['ttft']['mape']:.1f}% | {100 * m['ttft']['median_ape']:.1f}% | "
           f"{m['steps']['twin']} / {m['steps']['recorded']} | {1e3 * m['ttft_mean_s']['twin']:.0f} / "
           f"{1e3 * m['ttft_mean_s']['recorded']:.0f} |")
    return row, engine_ttfts(rec)


def diagnose(out: Path) -> str:
    """Where a real study's prediction error comes from, with numbers:

    - profile: ``latroute validate`` of each server's whole study session
      (its recording: the recorded arrivals and assignment on the twin with
      the calibrated profile): per-request engine TTFT MAPE, step-count ratio;
    - front end: per run, median(client TTFT - engine TTFT), against the
      pool's ``frontend_overhead_s``;
    - view: per run, the median of the router's estimate for the backend it
      chose minus the TTFT the proxy then saw (routers with an estimator).
    """
    from traces.store import open_trace

    pool = json.loads((out / "pool-twin.json").read_text())
    lines = [f"front end in the twin's pool: {1e3 * pool['frontend_overhead_s']:.1f} ms", "",
             "| server | engine TTFT MAPE, twin vs recording (whole session) | median APE | steps twin / recorded | "
             "mean engine TTFT twin / recorded, ms |", "|---|---|---|---|---|"]
    engine = []
    for session in sorted((out / "servers").glob("session*")):
        for inst in pool["instances"]:
            row = _validate_session(out, session, inst["model"], inst["profile"])
            if row:
                lines.append(row[0])
                engine.append(row[1])
    eng = pd.concat(engine)
    lines += ["", "| run | front end, ms (median client - engine TTFT) | estimate - proxy TTFT, ms (median) |",
              "|---|---|---|"]
    for run in sorted((out / "runs").iterdir()):
        cl = open_trace(run / "client").read("requests")[["client_id", "ttft_s"]]
        m = cl.merge(eng, on="client_id", suffixes=("_client", "_engine"))
        fe = float((m["ttft_s_client"] - m["ttft_s_engine"]).median() * 1e3)
        dec = open_trace(run / "log").read("decisions")
        req = open_trace(run / "log").read("requests").set_index("request_id")
        ch = dec[dec["chosen"] & (dec["attempt"] == 0)].set_index("request_id")
        err = (ch["estimate_s"] - req["ttft_s"].reindex(ch.index)) * 1e3
        lines.append(f"| {run.name} | {fe:.1f} | {err.median():.1f} |" if err.notna().any() else
                     f"| {run.name} | {fe:.1f} | (no estimator) |")
    text = "\n".join(lines)
    (out / "diagnosis.md").write_text(text + "\n")
    return text
