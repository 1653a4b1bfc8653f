"""Killed runs: SIGKILL in the middle of import, generate, sweep,
estimate and report leaves no orphan process after 5 s, no partial --out
(a previous one untouched), and the next run to the same --out removes the
debris (saying so in one line); SIGTERM stops a sweep and its workers at
once. Real subprocesses: signals cannot be sent to an in-process run.
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")


def latroute(*args) -> list[str]:
    return [sys.executable, "-m", "harness.cli", *[str(a) for a in args]]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and (f := _stat_fields(int(p.name))) is not None:
            children.setdefault(int(f[1]), []).append(int(p.name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    f = _stat_fields(pid)
    return f is not None and f[0] != "Z"


def tree_digest(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


def kill_when(cmd: list[str], ready: Callable[[], bool], sig: int = signal.SIGKILL, timeout: float = 60.0,
              ) -> tuple[subprocess.Popen, list[int]]:
    """Start ``cmd``, send ``sig`` as soon as ``ready()`` (polled every 5 ms);
    returns the process (waited for) and the descendants it had just before."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"{cmd[3:5]} ended (exit {proc.returncode}) before the moment to kill it: "
                        f"{proc.stderr.read().decode()[-800:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{cmd[3:5]} never reached the moment to kill it")
        time.sleep(0.005)
    kids = descendants(proc.pid)
    proc.send_signal(sig)
    proc.wait(timeout=30)
    return proc, kids


def assert_no_orphans(kids: list[int]) -> None:
    time.sleep(5)
    left = [k for k in kids if alive(k)]
    assert not left, f"processes outlived their killed parent: {left}"


def staging(out: Path) -> list[Path]:
    return sorted(out.parent.glob(f".{out.name}.tmp-*"))


def assert_next_run_cleans(args: list, out: Path) -> None:
    debris = staging(out)
    res = run_cli(*args)
    assert res.exit_code == 0, res.output
    if debris:
        notes = [ln for ln in res.stderr.splitlines() if "leftover" in ln]
        assert len(notes) == 1 and all(d.name in notes[0] for d in debris), (debris, res.stderr)
    assert not staging(out) and not list(out.parent.glob(f".{out.name}.lock"))


def test_sigkill_during_trace_import(tmp_path):
    from traces.workload.synth_azure import write_azure_csv

    csv = tmp_path / "big.csv"
    write_azure_csv(csv, 1_500_000)
    out = tmp_path / "imported"
    args = ["trace", "import", "azure", csv, "--out", out, "--chunk-rows", "20000"]
    proc, kids = kill_when(latroute(*args), lambda: any(p.glob("requests.parquet") for p in staging(out)))
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists() and staging(out), "a killed import left a partial --out (or no staging dir to clean)"
    assert_no_orphans(kids)
    assert_next_run_cleans([*args, "--chunk-rows", "500000"], out)


def test_sigkill_during_trace_generate_leaves_the_previous_output(tmp_path):
    out = tmp_path / "wl"
    assert run_cli("trace", "generate", "--out", out, "--requests", "50", "--rate", "5").exit_code == 0
    before = tree_digest(out)
    args = ["trace", "generate", "--out", out, "--requests", "1500000", "--rate", "50", "--force"]
    proc, kids = kill_when(latroute(*args), lambda: bool(staging(out)))
    assert proc.returncode == -signal.SIGKILL
    assert tree_digest(out) == before, "a killed --force run changed the previous output"
    assert_no_orphans(kids)
    assert_next_run_cleans(["trace", "generate", "--out", out, "--requests", "60", "--rate", "5", "--force"], out)


SWEEP = ["sweep", "--rates", "1,2,3,4,5,6,7,8,9,10,11,12", "--routers", "shortest-queue,round-robin",
         "--requests", "30", "--noise", "off"]


def _cells(out: Path) -> int:
    return len(list(out.joinpath("cells").glob("*.parquet"))) if out.joinpath("cells").is_dir() else 0


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two workers need two cores")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_sweep_takes_its_workers_and_resumes(tmp_path, sig):
    out = tmp_path / "s"
    t0 = time.monotonic()
    proc, kids = kill_when(latroute(*SWEEP, "--workers", "2", "--out", out),
                           lambda: _cells(out) >= 2 and len(descendants_of_running(out)) >= 2, sig=sig, timeout=120)
    assert kids, "the sweep had no workers to check"
    if sig == signal.SIGTERM:
        assert time.monotonic() - t0 < 60 and proc.returncode in (130, 143, -signal.SIGTERM), proc.returncode
    else:
        assert proc.returncode == -signal.SIGKILL
    assert_no_orphans(kids)
    done = _cells(out)
    assert done >= 2 and (out / "INCOMPLETE").exists() and not (out / "results.parquet").exists()
    refused = run_cli(*SWEEP, "--workers", "1", "--out", out)
    assert refused.exit_code == 2 and "--resume" in refused.stderr and "--force" in refused.stderr
    res = run_cli(*SWEEP, "--workers", "1", "--out", out, "--resume")
    assert res.exit_code == 0, res.output
    assert _cells(out) == 24 and not (out / "INCOMPLETE").exists()




def descendants_of_running(out: Path) -> list[int]:
    """Workers of the sweep writing ``out`` (its lock file names its pid)."""
    lock = out.with_name(f".{out.name}.lock")
    try:
        pid = int(lock.read_text().strip())
    except (OSError, ValueError):
        return []
    return descendants(pid)


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Path:
    """A replayed trace with steps (what estimate reads) and a result (what report reads)."""
    out = tmp_path_factory.mktemp("sig") / "r"
    # 2,000 requests: estimating them takes seconds, so a kill 1.5 s in lands mid-run, never after the commit
    res = run_cli("replay", "--rate", "6", "--requests", "2000", "--router", "shortest-queue", "--record-steps",
                  "--out", out)
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.parametrize("command", ["estimate", "report"])
def test_sigkill_during_estimate_and_report_leaves_the_previous_output(tmp_path, served, command):
    out = tmp_path / command
    args = (["estimate", served / "served", "--estimators", "sfs", "--out", out] if command == "estimate"
            else ["report", served, "--out", out])
    first = run_cli(*args)
    assert first.exit_code == 0, first.output
    before = tree_digest(out)
    start = time.monotonic()
    if command == "estimate":
        def moment() -> bool:
            return time.monotonic() - start > 1.5
    else:  # report renders its figures into its staging directory: kill while that is there
        def moment() -> bool:
            return any(p.name.startswith(f".{out.name}.tmp-") for p in out.parent.iterdir())
    proc, kids = kill_when(latroute(*args, "--force"), moment)
    assert proc.returncode == -signal.SIGKILL, "finished before it could be killed: make the run longer"
    assert tree_digest(out) == before, "a killed --force run changed the previous output"
    assert_no_orphans(kids)
    assert_next_run_cleans([*args, "--force"], out)
