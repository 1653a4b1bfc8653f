"""Coverage of SFS's TTFT distribution on every real vLLM recording:
each recording estimated with oracle lengths, its profile
calibrated on another recording of the same model and host (d1 on d2,
d2-d7 on d1, d1b/d1c on each other, d8 on d9, d9 on d8), or, where the
recording is the only one of its model and host (d3, d10), on its own first
30% of steps, then scored only on queries arriving after that window.
Recordings whose decision agreement with the kernel is below 100% (the
prefix-cache ones before the prefix-cache kernel lands) are reported as
pending, not scored.

``latroute study coverage RECORDINGS_DIR OUT.json [--online-speed] [--in-sample] [--recalibrate STEP]``
(recordings imported with ``latroute trace import vllm-record``; ``--in-sample``: each recording
calibrated on itself, the ceiling when the profile comes from the same run and host; ``--recalibrate``:
the quantiles recalibrated online from earlier first tokens, ``estimators.evaluate.conformal``, and the
model's own coverage reported beside it).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from estimators.estimate import QUANTILE_COLUMNS, RAW_QUANTILE_COLUMNS, EstimateConfig, coverage, estimate_trace
from estimators.evaluate.conformal import RecalibrationConfig, recalibrate
from estimators.timemodel.calibrate import (
    CalibrationConfig,
    best_form,
    build_profile,
    calibrate_instance,
    fit_forms,
    load_steps,
)
from estimators.timemodel.online_speed import OnlineSpeedConfig
from harness.twin.fidelity.decisions import decision_agreement
from traces.store import open_trace

CALIBRATE_ON = {"d1_": "d2_", "d2_": "d1_", "d4_": "d1_", "d5_": "d1_", "d6_": "d1_", "d7_": "d1_",
                "d1b_": "d1c_", "d1c_": "d1b_", "d8_": "d9_", "d9_": "d8_"}
OWN_PREFIX = ("d3_", "d10_")
OWN_SHARE = 0.3


def _match(root: Path, prefix: str) -> Path:
    return next(p for p in sorted(root.iterdir()) if p.name.startswith(prefix))


def _own_profile(path: Path, inst: str):
    """A profile fitted on the first 30% of the recording's steps, and the
    time that window ends."""
    data = load_steps([path], inst)
    steps = data.steps.sort_values("start_s").reset_index(drop=True)
    cut = steps.iloc[: int(len(steps) * OWN_SHARE)]
    data.steps = cut
    cfg = CalibrationConfig(instance=inst)
    res = fit_forms(cut, cfg)
    return build_profile(f"{path.name}-first30", res[best_form(res)], data, cfg), float(cut["end_s"].max())


def study(root: Path, online_speed: bool = False, in_sample: bool = False,
          recalibration: RecalibrationConfig | None = None) -> dict:
    """Coverage per recording; ``in_sample``: each calibrated on itself
    (all its steps, every query scored), the ceiling a profile of the
    recording's own run and host gives."""
    out = {}
    for path in sorted(p for p in root.iterdir() if p.is_dir()):
        trace = open_trace(path)
        inst = str(trace.read("instances")["instance_id"].iloc[0])
        agree = decision_agreement(trace, inst).rate
        prefix = next((k for k in CALIBRATE_ON if path.name.startswith(k)), None)
        row: dict = {"decision_agreement": agree}
        if agree < 1.0:
            row["status"] = "pending (decision agreement below 100%: needs the prefix-cache kernel)"
            out[path.name] = row
            continue
        after = -np.inf
        reqs = trace.read("requests")
        if in_sample:
            prof = calibrate_instance(path, inst)
            row["calibrated_on"] = "itself (in-sample)"
            seen = reqs["ttft_s"]
        elif prefix is not None:
            src = _match(root, CALIBRATE_ON[prefix])
            prof = calibrate_instance(src, inst)
            row["calibrated_on"] = src.name
            seen = open_trace(src).read("requests")["ttft_s"]
        else:
            prof, after = _own_profile(path, inst)
            row["calibrated_on"] = f"own first {int(OWN_SHARE * 100)}% of steps (scored after {after:.1f} s)"
            seen = reqs["ttft_s"][reqs["arrival_s"] + reqs["ttft_s"] <= after]  # first tokens back by then
        overhead = float(trace.meta.get("frontend_overhead_s", 0.0) or 0.0)
        res = estimate_trace(trace, {inst: (prof, None)},
                             EstimateConfig(estimators=("sfs",), lengths="oracle", frontend_overhead_s=overhead,
                                            online_speed=OnlineSpeedConfig() if online_speed else None,
                                            recalibration=recalibration))
        est = res.estimates
        arrival = reqs.set_index("request_id")["arrival_s"].loc[est["request_id"]].to_numpy()
        if recalibration is not None:  # what recalibration makes of a model that knows nothing
            const = np.full((len(est), 3), float(np.nanmedian(seen)))
            est = est.assign(**dict(zip(CONSTANT, recalibrate(arrival, est["true_s"].to_numpy(), const,
                                                              recalibration).T)))
        est = est[arrival > after]
        row.update(coverage(est) or {})
        row["pinball"] = pinball(est, QUANTILES)
        if recalibration is not None:
            raw = est[["true_s"]].assign(**dict(zip(QUANTILES, (est[k] for k in RAW_QUANTILE_COLUMNS))))
            row["raw"] = {**coverage(raw), "pinball": pinball(raw, QUANTILES)}
            c = est[["true_s"]].assign(**dict(zip(QUANTILES, (est[k] for k in CONSTANT))))
            row["constant_recalibrated"] = {**coverage(c), "pinball": pinball(c, QUANTILES),
                                            "p90_over_p50": float(np.median(c["p90_s"] / c["p50_s"]))}
            row["p90_over_p50"] = float(np.median(est["p90_s"] / est["p50_s"]))
        ok = np.isfinite(est["est_s"].to_numpy())
        row["sfs_mape"] = float(np.mean(np.abs(est["est_s"].to_numpy()[ok] / est["true_s"].to_numpy()[ok] - 1.0)))
        row["status"] = "scored"
        out[path.name] = row
    return out


QUANTILES = tuple(QUANTILE_COLUMNS)
CONSTANT = ("c50_s", "c90_s", "c99_s")


def pinball(est, columns) -> dict:
    """Mean relative pinball (quantile) loss of the p50 and p90 columns:
    max(L d, (L - 1) d) with d = (measured - quantile) / measured. Lower is
    sharper at the same calibration; coverage alone cannot tell a useful
    distribution from a wide one."""
    t = est["true_s"].to_numpy()
    out = {}
    for col, level in zip(columns[:2], (0.5, 0.9)):
        d = (t - est[col].to_numpy()) / t
        out[col[:3]] = float(np.mean(np.maximum(level * d, (level - 1) * d)))
    return out


def within(row: dict, points: float = 5.0) -> bool:
    """p50 and p90 coverage both within ``points`` of nominal."""
    return abs(100 * row["p50"] - 50) <= points and abs(100 * row["p90"] - 90) <= points


def print_rows(res: dict, step: float | None, echo=print) -> None:
    """One line per recording (and the recalibration's before and constant lines), then the count within 5 points."""
    for name, r in res.items():
        if r["status"] == "scored":
            echo(f"{name:<34} n {r['n']:>4}  p50 {100 * r['p50']:5.1f}%  p90 {100 * r['p90']:5.1f}%  "
                 f"p99 {100 * r['p99']:5.1f}%  SFS MAPE {100 * r['sfs_mape']:5.1f}%  (calibrated on {r['calibrated_on']}; "
                 f"agreement {r['decision_agreement']:.3f})")
            if "raw" in r:
                raw, c = r["raw"], r["constant_recalibrated"]
                echo(f"{'':<34} before recalibration (step {step:g}): p50 {100 * raw['p50']:5.1f}%  "
                     f"p90 {100 * raw['p90']:5.1f}%  p99 {100 * raw['p99']:5.1f}%; pinball p50/p90 "
                     f"{raw['pinball']['p50']:.3f}/{raw['pinball']['p90']:.3f} -> {r['pinball']['p50']:.3f}/"
                     f"{r['pinball']['p90']:.3f}, p90/p50 {r['p90_over_p50']:.2f}")
                echo(f"{'':<34} a constant recalibrated the same way: p50 {100 * c['p50']:5.1f}%  "
                     f"p90 {100 * c['p90']:5.1f}%; pinball {c['pinball']['p50']:.3f}/{c['pinball']['p90']:.3f}, "
                     f"p90/p50 {c['p90_over_p50']:.2f}")
        else:
            echo(f"{name:<34} {r['status']} (agreement {r['decision_agreement']:.3f})")
    scored = [r for r in res.values() if r["status"] == "scored"]
    echo(f"p50 and p90 within 5 points of nominal: {sum(within(r) for r in scored)} of {len(scored)}")
