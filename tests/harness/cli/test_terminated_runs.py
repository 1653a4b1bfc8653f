"""Killed and terminated runs leave nothing half-written: SIGTERM
on ``bench`` removed nothing (its synthetic CSV stayed), a killed ``demo``
left a partial demo directory. Real subprocesses, bounded."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO


def _start(*args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness.cli", *[str(a) for a in args]], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def _signal_when(proc: subprocess.Popen, ready: Callable[[], bool], sig: int, timeout: float = 90) -> str:
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, proc.stderr.read().decode()[-800:]
            assert time.monotonic() < deadline, "never reached the moment to signal it"
            time.sleep(0.01)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return err.decode()


@pytest.mark.fuzz  # ~5 s: a real bench child process
def test_sigterm_on_bench_removes_its_synthetic_csv(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    proc = _start("bench", "--only", "import", "--import-rows", "3000000", "--workdir", work)
    err = _signal_when(proc, lambda: any(work.glob("*/azure_synth.csv")), signal.SIGTERM)
    assert proc.returncode == 143 and err.strip().splitlines() == ["terminated"], (proc.returncode, err)
    assert list(work.iterdir()) == [], list(work.rglob("*"))


@pytest.mark.fuzz
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_a_killed_demo_leaves_no_partial_output(tmp_path, sig):
    out = tmp_path / "demo"

    def staging() -> list[Path]:
        return sorted(tmp_path.glob(".demo.tmp-*"))

    proc = _start("demo", "--out", out)
    _signal_when(proc, lambda: any((s / "workload" / "requests.parquet").exists() for s in staging()), sig)
    assert not out.exists(), "a killed demo left a partial --out"
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and not staging()
        return
    debris = staging()
    assert proc.returncode == -signal.SIGKILL and len(debris) == 1
    # the next run removes the dead run's temporary (and is then stopped itself)
    proc = _start("demo", "--out", out)
    err = _signal_when(proc, lambda: staging() and debris[0] not in staging(), signal.SIGINT)
    assert "leftover" in err and debris[0].name in err, err
    assert proc.returncode == 130 and not staging() and not out.exists(), (proc.returncode, err)
