"""Regenerate the tables of docs/results/learned-estimates.md:
SFS vs the learned (llm-d style) estimator vs the throughput baseline on the
12 vllm_cpu recordings and the Llama-3.3-70B A100 request-level runs, and
the learned model's training cost.

Why a script: the study is ~30 latroute commands (imports, calibrations,
estimates); running them one at a time here keeps the CPU share small and
the commands exact (each is printed and recorded in ``OUT/commands.txt``).
Existing outputs are reused, so an interrupted run resumes.

``latroute study learned OUT_DIR [--timeout S] [--only recordings|requests]``
"""
from __future__ import annotations

import json
import shlex
import subprocess
import time
from pathlib import Path
from typing import NamedTuple

from harness.studies import coverage

DATA = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data").resolve()
CPU = DATA / "vllm_cpu"
A100 = DATA / "vllm_bench_serving_a100_per_request" / "runs"
# The coverage study's profiles, taken from it (its keys are the recordings'
# name prefixes, "d1_"): a sibling recording of the same model and host, or
# the recording's own first 30% of steps.
CALIBRATE_ON = {k.rstrip("_"): v.rstrip("_") for k, v in coverage.CALIBRATE_ON.items()}
OWN_HEAD = tuple(p.rstrip("_") for p in coverage.OWN_PREFIX)
HEAD_WINDOW = f"0:{coverage.OWN_SHARE}"
ESTIMATORS = "sfs,learned,throughput"
RUN = "serving_meta-llama-Llama-3.3-70B-Instruct_tp8_pp1_sharegpt_qps"
RUNS = {"q1": "01", "q4": "04", "q16": "16", "qinf": "inf"}
# PROVENANCE gives no held-out split; the request-level docs calibrate on
# 1 and 16 q/s and hold out 4 q/s and all-at-once.
CALIBRATION_RUNS = ("q1", "q16")


def run(cmd: list[str], out: Path, log: Path, timeout: float) -> str:
    """Run one latroute command unless its output exists; returns its status."""
    line = " ".join(shlex.quote(c) for c in cmd)
    with log.open("a") as f:
        f.write(line + "\n")
    if out.exists():
        return "reused"
    print("+", line, flush=True)
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  TIMEOUT after {timeout:.0f} s", flush=True)
        return "timeout"
    (out.parent / f"{out.name}.log").write_text(p.stdout + p.stderr)
    print(f"  rc {p.returncode}, {time.monotonic() - t0:.1f} s", flush=True)
    return "ok" if p.returncode == 0 else f"rc {p.returncode}"


def recordings(root: Path, log: Path, timeout: float) -> dict:
    """Import, calibrate and estimate the 12 recordings, scored after the first 30% of steps."""
    status = {}
    for d in sorted(CPU.iterdir()):
        if d.is_dir():
            name = d.name.split("_")[0]
            run(["latroute", "trace", "import", "vllm-record", str(d), "--out", str(root / "recs" / name)],
                root / "recs" / name, log, timeout)
    for name in sorted(CALIBRATE_ON) + list(OWN_HEAD):
        rec = root / "recs" / name
        if name in OWN_HEAD:
            prof = root / "prof" / f"{name}-head.json"
            run(["latroute", "calibrate", str(rec), "--steps-window", HEAD_WINDOW, "--out", str(prof)], prof, log, timeout)
        else:
            src = CALIBRATE_ON[name]
            prof = root / "prof" / f"{src}.json"
            run(["latroute", "calibrate", str(root / "recs" / src), "--out", str(prof)], prof, log, timeout)
        (root / "prof").mkdir(exist_ok=True)
        out = root / "est" / name
        status[name] = run(["latroute", "estimate", str(rec), "--profile", str(prof), "--estimators", ESTIMATORS,
                            "--score-window", "0.3:1", "--out", str(out)], out, log, timeout)
    return status


def requests(root: Path, log: Path, timeout: float) -> dict:
    """Import the tp8 Llama-3.3-70B runs, calibrate on 1 and 16 q/s (warm), estimate every run."""
    status = {}
    for name, q in RUNS.items():
        run(["latroute", "trace", "import", "vllm-bench", str(A100 / f"{RUN}_{q}__01_tp8_pp1.json"),
             "--out", str(root / "reqs" / name)], root / "reqs" / name, log, timeout)
    prof = root / "prof" / "w70.json"
    (root / "prof").mkdir(exist_ok=True)
    run(["latroute", "calibrate", "--from-requests", str(root / "reqs" / "q1"), str(root / "reqs" / "q16"),
         "--warm", str(root / "reqs" / "q16"), "--frontend", "measured", "--out", str(prof)], prof, log, timeout)
    for name in ("q4", "qinf", "q1", "q16"):
        out = root / "est" / name
        status[name] = run(["latroute", "estimate", str(root / "reqs" / name), "--profile", str(prof),
                            "--prefix-cache", "warm", "--estimators", ESTIMATORS, "--out", str(out)],
                           out, log, timeout)
    return status


def drift(root: Path, log: Path, timeout: float) -> dict:
    """Host drift: d1c (slower host) on d1's profile, cold, with d1's model carried in, and SFS's online speed."""
    rec, prof = root / "recs" / "d1c", root / "prof" / "d1.json"
    base = ["latroute", "estimate", str(rec), "--profile", str(prof), "--estimators", ESTIMATORS,
            "--score-window", "0.3:1"]
    variants = {"drift-d1c": [], "carry-d1c": ["--train-on", str(root / "recs" / "d1")],
                "speed-d1c": ["--online-speed", "on"]}
    return {name: run(base + extra + ["--out", str(root / "est" / name)], root / "est" / name, log, timeout)
            for name, extra in variants.items()}


def after30(root: Path, log: Path, timeout: float) -> dict:
    """The held-out 4 q/s run scored after the first 30% of its steps (the learned model warmed up)."""
    out = root / "est" / "q4-after30"
    return {"q4-after30": run(["latroute", "estimate", str(root / "reqs" / "q4"), "--profile",
                               str(root / "prof" / "w70.json"), "--prefix-cache", "warm", "--estimators", ESTIMATORS,
                               "--score-window", "0.3:1", "--out", str(out)], out, log, timeout)}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _ms(x) -> str:
    return "-" if x is None else f"{1000 * x:.1f} ms"


def table(root: Path, names: list[str], labels: dict[str, str]) -> str:
    """One markdown row per scored trace: MAPE, p90 APE, p90 coverage, p50/p90 pinball, µs per estimate."""
    head = ("| trace | n | MAPE sfs / learned / thr. | p90 APE sfs / learned / thr. | p90 cov. sfs / learned "
            "| pinball p50 sfs / learned | pinball p90 sfs / learned | µs/est. sfs / learned (mean; median) / thr. "
            "| learned cold start |\n|" + "---|" * 9 + "\n")
    rows = []
    for name in names:
        f = root / "est" / name / "metrics.json"
        if not f.exists():
            rows.append(f"| {labels.get(name, name)} | skipped | | | | | | | |")
            continue
        e = json.loads(f.read_text())["estimators"]
        s, ll, t = e["sfs"], e["learned"], e["throughput"]
        cov = [x.get("coverage", {}).get("p90") for x in (s, ll)]
        pin = [x.get("pinball_s") or {} for x in (s, ll)]
        tr = ll["training"]
        rows.append(
            f"| {labels.get(name, name)} | {s['n']} | {_pct(s['mape'])} / {_pct(ll['mape'])} / {_pct(t['mape'])} "
            f"| {_pct(s['p90_ape'])} / {_pct(ll['p90_ape'])} / {_pct(t['p90_ape'])} "
            f"| {_pct(cov[0])} / {_pct(cov[1])} "
            f"| {_ms(pin[0].get('p50'))} / {_ms(pin[1].get('p50'))} "
            f"| {_ms(pin[0].get('p90'))} / {_ms(pin[1].get('p90'))} "
            f"| {s['mean_us']:.0f} / {ll['mean_us']:.0f}; {ll['median_us']:.0f} / {t['mean_us']:.0f} "
            f"| {_pct(tr['cold_start_share'])} |")
    return head + "\n".join(rows) + "\n"


def training(root: Path, names: list[str]) -> str:
    """The learned model's fits per trace: count, samples seen, ms per fit, wall time of all fits."""
    head = ("| trace | scored | fits | samples seen | mean ms per fit | fit wall s | amortised fit µs per scored "
            "estimate | estimate wall s |\n|---|---|---|---|---|---|---|---|\n")
    rows = []
    for name in names:
        f = root / "est" / name / "metrics.json"
        if f.exists():
            m = json.loads(f.read_text())
            tr = m["estimators"]["learned"]["training"]
            per_fit = "-" if tr["mean_fit_ms"] is None else f"{tr['mean_fit_ms']:.1f}"
            rows.append(f"| {name} | {m['estimators']['learned']['n']} | {tr['fits']} | {tr['samples_seen']} "
                        f"| {per_fit} | {tr['fit_wall_s']:.2f} "
                        f"| {tr['amortised_fit_us_per_estimate']:.0f} | {m['wall_s']:.1f} |")
    return head + "\n".join(rows) + "\n"


def study(out: Path, timeout: float, only: str | None) -> str:
    """Run the missing commands, write ``out/tables.md`` and return it."""
    a = _Args(out, timeout, only)
    for sub in ("recs", "reqs", "prof", "est"):
        (a.out / sub).mkdir(parents=True, exist_ok=True)
    log = a.out / "commands.txt"
    recs = sorted(CALIBRATE_ON) + list(OWN_HEAD)
    recs.sort(key=lambda n: (int("".join(c for c in n if c.isdigit())), n))
    if a.only != "requests":
        recordings(a.out, log, a.timeout)
    if a.only != "requests":
        drift(a.out, log, a.timeout)
    if a.only != "recordings":
        requests(a.out, log, a.timeout)
        after30(a.out, log, a.timeout)
    labels = {n: f"{n} ({CALIBRATE_ON[n]} profile)" if n in CALIBRATE_ON else f"{n} (own first 30%)" for n in recs}
    labels.update(q1="1 q/s (calibration run)", q4="4 q/s (held out)", q16="16 q/s (calibration run)",
                  qinf="all at once (held out)", **{"q4-after30": "4 q/s (held out), after first 30%"})
    labels.update({"drift-d1c": "d1c on d1's profile (other host)", "carry-d1c": "same, d1's model carried in",
                   "speed-d1c": "same, SFS online speed on"})
    reqs = ["q4", "q4-after30", "qinf", "q1", "q16"]
    hosts = ["d1c", "drift-d1c", "carry-d1c", "speed-d1c"]
    text = ("## Recordings\n\n" + table(a.out, recs, labels) + "\n## A100 request-level\n\n"
            + table(a.out, reqs, labels) + "\n## Host drift\n\n" + table(a.out, hosts, labels)
            + "\n## Training\n\n" + training(a.out, recs + reqs + hosts[1:]))
    (a.out / "tables.md").write_text(text)
    return text


class _Args(NamedTuple):
    out: Path
    timeout: float
    only: str | None
