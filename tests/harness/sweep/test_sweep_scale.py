"""Sweeps past one machine: every finished cell on disk at once, --resume
after SIGKILL, no orphan workers, Ray gives the same bytes as the local
pool, intervals over paired seeds, TOML specifications."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from reports.paired_stats import mean_ci, paired, t975
from tests.conftest import REPO, assert_refused, run_cli

TINY = ["--requests", "30", "--noise", "off"]


def _sweep_cmd(out: Path, rates: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli", "sweep", "--rates", rates, "--routers",
            "shortest-queue,round-robin", *TINY, "--out", str(out), *extra]


def _children(pid: int) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(p.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


RATES_50 = ",".join(str(r) for r in np.round(np.linspace(1, 9, 50), 3))


def test_sigkill_half_way_then_resume_finishes_with_the_same_results(tmp_path):
    """A 100-cell sweep (2 routers x 50 rates) killed half way with SIGKILL:
    its finished cells are on disk, no worker outlives it, --resume runs
    only the missing cells, and the results equal an uninterrupted run's."""
    out = tmp_path / "killed"
    proc = subprocess.Popen(_sweep_cmd(out, RATES_50, "--workers", "2"), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if out.joinpath("cells").is_dir() and len(list(out.joinpath("cells").glob("*.parquet"))) >= 50:
            break
        time.sleep(0.05)
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = {p.name: p.stat().st_mtime_ns for p in out.joinpath("cells").glob("*.parquet")}
    assert 50 <= len(done_before) < 100, len(done_before)
    assert (out / "INCOMPLETE").exists() and not (out / "results.parquet").exists()
    time.sleep(5)
    assert not [w for w in workers if _alive(w)], "pool workers outlived their killed sweep"
    # the next run refuses to silently overwrite, then resumes
    refused = run_cli("sweep", "--rates", RATES_50, "--routers", "shortest-queue,round-robin", *TINY, "--out", out)
    assert refused.exit_code == 2 and "--resume" in refused.stderr
    res = subprocess.run(_sweep_cmd(out, RATES_50, "--workers", "2", "--resume"), cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    after = {p.name: p.stat().st_mtime_ns for p in out.joinpath("cells").glob("*.parquet")}
    assert len(after) == 100
    assert all(after[k] == v for k, v in done_before.items()), "resume re-ran finished cells"
    whole = tmp_path / "whole"
    assert run_cli("sweep", "--rates", RATES_50, "--routers", "shortest-queue,round-robin", *TINY, "--workers", "1",
                   "--out", whole).exit_code == 0
    assert (out / "results.parquet").read_bytes() == (whole / "results.parquet").read_bytes()
    assert not (out / "INCOMPLETE").exists()


def test_resume_refuses_another_specification_and_force_only_replaces_a_sweep(tmp_path):
    out = tmp_path / "s"
    assert run_cli("sweep", "--rates", "4,8", "--routers", "shortest-queue", *TINY, "--out", out).exit_code == 0
    other = run_cli("sweep", "--rates", "4,9", "--routers", "shortest-queue", *TINY, "--out", out, "--resume")
    assert other.exit_code == 2 and "sweep.json" in other.stderr and "specification" in other.stderr
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert_refused(run_cli("sweep", "--rates", "4", "--routers", "shortest-queue", *TINY, "--out", foreign,
                           "--force"), None, "not written by a latroute sweep")
    assert (foreign / "notes.txt").read_text() == "keep me"
    again = run_cli("sweep", "--rates", "4", "--routers", "shortest-queue", *TINY, "--out", out, "--force")
    assert again.exit_code == 0, again.output


def test_ctrl_c_exits_130_and_keeps_finished_cells(tmp_path):
    out = tmp_path / "int"
    proc = subprocess.Popen(_sweep_cmd(out, RATES_50, "--workers", "1"), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (out.joinpath("cells").is_dir()
                                               and len(list(out.joinpath("cells").glob("*.parquet"))) >= 3):
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err and len(list(out.joinpath("cells").glob("*.parquet"))) >= 3


def test_toml_specification_fills_the_options(tmp_path):
    spec = tmp_path / "study.toml"
    spec.write_text('[sweep]\nrates = [4, 8]\nrouters = ["shortest-queue", "round-robin"]\nrequests = 30\n'
                    'seeds = 2\nnoise = "off"\n')
    res = run_cli("sweep", "--spec", spec, "--out", tmp_path / "o")
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(tmp_path / "o" / "results.parquet")
    assert sorted(df["rate"].unique()) == [4, 8] and sorted(df["seed"].unique()) == [0, 1] and len(df) == 8
    bad = tmp_path / "bad.toml"
    bad.write_text("rates = [4]\nrouterz = 1\n")
    assert_refused(run_cli("sweep", "--spec", bad, "--out", tmp_path / "b"), tmp_path / "b", "bad.toml", "routerz")


def test_intervals_over_paired_seeds():
    assert t975(4) == pytest.approx(2.776)
    ci = mean_ci([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776 * np.std([1, 2, 3, 4, 5], ddof=1) / np.sqrt(5)
    assert ci["mean"] == 3.0 and ci["ci95"] == pytest.approx([3 - half, 3 + half])
    assert mean_ci([2.0])["ci95"] is None
    # pairing removes the shared seed effect: a constant 10% better router has a tight ratio interval
    base = np.array([1.0, 3.0, 2.0, 5.0])
    p = paired(base * 1.1, base)
    assert p["ratio"]["ci95"] == pytest.approx([1.1, 1.1])
    assert mean_ci(np.arange(12.0))["bootstrap_ci95"][0] < 5.5 < mean_ci(np.arange(12.0))["bootstrap_ci95"][1]


def test_sweep_reports_auc_intervals_and_paired_ratio(tmp_path):
    res = run_cli("sweep", "--rates", "4,8", "--routers", "shortest-queue,round-robin", *TINY, "--seeds", "3",
                  "--out", tmp_path / "o")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    for v in m["routers"].values():
        lo, hi = v["auc_ontime_utility_ci"]["ci95"]
        assert lo <= v["auc_ontime_utility"] <= hi
    other = [v for k, v in m["routers"].items() if k != m["best_baseline"]["router"]]
    assert all("vs_best_baseline" in v for v in other)
    assert "95% intervals" in res.output


def test_ray_backend_gives_the_same_bytes_as_the_local_pool(tmp_path):
    pytest.importorskip("ray")
    rates = ",".join(str(r) for r in np.round(np.linspace(1, 9, 100), 3))
    local = run_cli("sweep", "--rates", rates, "--routers", "shortest-queue,round-robin", *TINY, "--workers", "2",
                    "--out", tmp_path / "local")
    assert local.exit_code == 0, local.output
    env = {**os.environ, "RAY_DISABLE_USAGE_STATS": "1"}
    res = subprocess.run([sys.executable, "-m", "harness.cli", "sweep", "--rates", rates, "--routers",
                          "shortest-queue,round-robin", *TINY, "--backend", "ray", "--workers", "2",
                          "--out", str(tmp_path / "ray")], cwd=REPO, capture_output=True, text=True, timeout=600,
                         env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "[ray] 200/200 cells" in res.stderr
    assert (tmp_path / "ray" / "results.parquet").read_bytes() == (tmp_path / "local" / "results.parquet").read_bytes()
    assert json.loads((tmp_path / "ray" / "metrics.json").read_text())["backend"] == "ray"


def _ray_processes() -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"ray::" in cmd or b"raylet" in cmd or b"gcs_server" in cmd:
                out.append(int(p.name))
    return out


def test_a_killed_ray_driver_leaves_nothing_of_the_ray_it_started(tmp_path):
    pytest.importorskip("ray")
    before = set(_ray_processes())
    out = tmp_path / "rk"
    rates = ",".join(str(r) for r in np.round(np.linspace(1, 9, 200), 3))
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "sweep", "--rates", rates, "--routers",
                             "shortest-queue", "--requests", "300", "--noise", "off", "--backend", "ray",
                             "--workers", "2", "--out", str(out)], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "RAY_DISABLE_USAGE_STATS": "1"})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (out.joinpath("cells").is_dir()
                                               and len(list(out.joinpath("cells").glob("*.parquet"))) >= 5):
        time.sleep(0.1)
    assert set(_ray_processes()) - before, "no Ray was running"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    time.sleep(5)
    assert not set(_ray_processes()) - before
    assert len(list(out.joinpath("cells").glob("*.parquet"))) >= 5


def test_check_can_gate_on_the_interval_over_seeds(tmp_path):
    out = tmp_path / "s"
    assert run_cli("sweep", "--rates", "4,8", "--routers", "shortest-queue,round-robin", *TINY, "--seeds", "3",
                   "--out", out).exit_code == 0
    m = json.loads((out / "metrics.json").read_text())
    v = m["routers"]["shortest-queue"]
    lo, hi = v["auc_ontime_utility_ci"]["ci95"]
    assert hi > v["auc_ontime_utility"] * 1.001, "the test needs some spread over seeds"
    # a baseline a little above the mean, but inside the interval: one draw regresses, the interval does not
    target = (v["auc_ontime_utility"] + hi) / 2
    base = tmp_path / "b.json"
    assert run_cli("check", out, "--baseline", base, "--write-baseline").exit_code == 0
    doc = json.loads(base.read_text())
    doc["metrics"] = {"routers.shortest-queue.auc_ontime_utility": target}
    base.write_text(json.dumps(doc))
    tol = "*.auc_ontime_utility=0"
    assert run_cli("check", out, "--baseline", base, "--tolerance", tol).exit_code == 1
    assert run_cli("check", out, "--baseline", base, "--tolerance", tol, "--interval").exit_code == 0
    doc["metrics"] = {"routers.shortest-queue.auc_ontime_utility": hi * 1.05}
    base.write_text(json.dumps(doc))
    assert run_cli("check", out, "--baseline", base, "--tolerance", tol, "--interval").exit_code == 1


def test_report_draws_bands_over_seeds(tmp_path):
    from reports.results import load_result
    from reports.series import figure_specs, sweep_cells

    out = tmp_path / "s"
    assert run_cli("sweep", "--rates", "4,8", "--routers", "shortest-queue", *TINY, "--seeds", "3",
                   "--out", out).exit_code == 0
    by = sweep_cells(load_result(out))
    assert (by["ontime_utility_half_ci"] > 0).all()
    (line,) = {s.name: s for s in figure_specs([load_result(out)])}["ontime_utility_vs_rate"].panels[0].series
    assert line.band is not None and all(lo < y < hi for lo, y, hi in zip(line.band[0], line.y, line.band[1]))
    res = run_cli("report", out, "--out", tmp_path / "rep")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "rep" / "ontime_utility_vs_rate.png").stat().st_size > 0


def test_a_ctrl_c_swallowed_under_a_cell_still_stops_the_sweep(monkeypatch):
    """Something under a cell (a C extension's signal handling, a cleanup)
    may consume the KeyboardInterrupt of a Ctrl-C; the sweep still stops
    after that cell instead of running on to the end and exiting 0."""
    from harness.sweep import driver as sweep

    calls = []

    def cell_that_swallows(spec, cell):
        calls.append(cell)
        if len(calls) == 2:
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs here
            except KeyboardInterrupt:
                pass
        return {"rate": cell.rate}, {"wall_s": 0.0}

    monkeypatch.setattr(sweep, "run_cell", cell_that_swallows)
    cells = [sweep.Cell(rate=float(r), router="shortest-queue") for r in range(1, 11)]
    with pytest.raises(KeyboardInterrupt):
        sweep.run_sweep(sweep.SweepSpec(), cells, workers=1)
    assert len(calls) == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
