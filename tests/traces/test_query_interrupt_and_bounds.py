"""``trace query`` is interruptible and bounded: DuckDB runs a
query in C++, so before this Ctrl-C (SIGINT to the process or its group)
was ignored until the query ended, and nothing limited how long it ran.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli

ENDLESS = "select count(*) from range(1000000000000) a"


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    import pandas as pd

    from traces.store import TraceWriter

    out = tmp_path_factory.mktemp("q") / "wl"
    with TraceWriter(out) as w:
        w.write_table("requests", pd.DataFrame({"request_id": range(20), "arrival_s": [0.1 * i for i in range(20)],
                                                "prompt_tokens": [10] * 20, "output_tokens": [5] * 20}))
    return out


def _threads(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_sigint_interrupts_a_running_query(small_trace):
    cmd = [sys.executable, "-m", "harness.cli", "trace", "query", str(small_trace), ENDLESS, "--timeout", "0"]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while _threads(proc.pid) < 8:  # DuckDB's worker threads: the query is running
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the query never started"
            time.sleep(0.02)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C goes to the whole process group
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGINT did not stop trace query within 10 s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.decode().strip().splitlines() == ["interrupted"], err


def test_timeout_stops_the_query_in_one_line(small_trace):
    t0 = time.monotonic()
    res = run_cli("trace", "query", small_trace, ENDLESS, "--timeout", "0.3")
    assert time.monotonic() - t0 < 10
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--timeout 0.3 s" in lines[0], lines
    assert "Traceback" not in res.output


def test_timeout_is_documented_and_checked(small_trace):
    res = run_cli("trace", "query", "--help")
    assert "--timeout" in res.output and "0: no limit" in res.output
    res = run_cli("trace", "query", small_trace, "select 1", "--timeout", "-1")
    assert res.exit_code == 2 and "--timeout" in res.stderr
    res = run_cli("trace", "query", small_trace, "select count(*) as n from requests", "--timeout", "0")
    assert res.exit_code == 0 and "20" in res.output


@pytest.mark.fuzz
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_sigterm_terminates_a_running_query(small_trace):
    cmd = [sys.executable, "-m", "harness.cli", "trace", "query", str(small_trace), ENDLESS]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while _threads(proc.pid) < 8:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143 and err.decode().strip() == "terminated", (proc.returncode, err)


def test_a_table_that_breaks_mid_query_is_named_not_the_sql(tmp_path, small_trace):
    import shutil

    from tests.support.clean_refusal import refused_cleanly

    t = tmp_path / "t"
    shutil.copytree(small_trace, t)
    f = t / "requests.parquet"
    f.write_bytes(b"\0" + f.read_bytes())  # the footer still parses; the column chunks are off by one
    refused_cleanly(["trace", "query", t, "select sum(prompt_tokens) from requests"], [t],
                    "requests.parquet", "requests")
