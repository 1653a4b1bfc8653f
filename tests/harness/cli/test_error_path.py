"""The command line's one error path: internal
errors in one line with exit 1 (``--debug`` keeps the traceback), Ctrl-C as
130 in one line, undecodable text in paths and option values, and the same
from real processes (split from test_bad_options.py, which keeps bad
values and click's usage errors).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, run_cli
from tests.support.clean_refusal import refused_cleanly


# ---------------------------------------------------------------------------------------------------------------
# Internal errors, Ctrl-C and undecodable text.
def _boom(exc: BaseException):
    def raiser(*args, **kwargs):
        raise exc
    return raiser


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_internal_error_is_one_line_and_exit_1(tmp_path, monkeypatch):
    monkeypatch.delenv("LATROUTE_DEBUG", raising=False)
    monkeypatch.setattr("harness.cli.trace.open_trace", _boom(RuntimeError("kaboom\nsecond line")))
    res = run_cli("trace", "info", tmp_path)
    assert res.exit_code == 1, res.output
    line = _one_line(res.stderr)
    assert line == "error: internal error: RuntimeError: kaboom second line (run with --debug for the traceback)"
    assert "Traceback" not in res.output


@pytest.mark.parametrize("how", ["--debug", "env"])
def test_debug_keeps_the_traceback(tmp_path, monkeypatch, how):
    monkeypatch.delenv("LATROUTE_DEBUG", raising=False)
    monkeypatch.setattr("harness.cli.trace.open_trace", _boom(RuntimeError("kaboom")))
    if how == "env":
        monkeypatch.setenv("LATROUTE_DEBUG", "1")
        res = run_cli("trace", "info", tmp_path)
    else:
        res = run_cli("--debug", "trace", "info", tmp_path)
    assert res.exit_code == 1
    assert "Traceback (most recent call last)" in res.stderr and "raise exc" in res.stderr
    assert res.stderr.rstrip().splitlines()[-1].startswith("error: internal error: RuntimeError: kaboom")


def test_latroute_debug_0_is_off(tmp_path, monkeypatch):
    monkeypatch.setenv("LATROUTE_DEBUG", "0")
    monkeypatch.setattr("harness.cli.trace.open_trace", _boom(ValueError("bad")))
    res = run_cli("trace", "info", tmp_path)
    assert res.exit_code == 1 and "Traceback" not in res.stderr and _one_line(res.stderr).startswith("error: internal")


def test_debug_does_not_change_a_bad_input_refusal(tmp_path):
    refused_cleanly(["--debug", "replay", "--rate", "nan", "--out", tmp_path / "o"], [tmp_path], "--rate: ")


def test_keyboard_interrupt_is_130_and_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr("harness.cli.trace.open_trace", _boom(KeyboardInterrupt()))
    res = run_cli("trace", "info", tmp_path)
    assert res.exit_code == 130, res.output
    assert _one_line(res.stderr) == "interrupted" and "Aborted" not in res.output


def test_failed_check_still_exits_1(tmp_path, monkeypatch):
    """A command's own exit status (check: 1 = regression) passes through."""
    monkeypatch.setattr("harness.cli.report.load_result", _boom(SystemExit(1)))
    assert run_cli("check", tmp_path, "--baseline", tmp_path / "b.json").exit_code == 1


def test_click_exception_keeps_its_status_in_one_line(tmp_path, monkeypatch):
    import click

    monkeypatch.setattr("harness.cli.trace.open_trace", _boom(click.ClickException("fit failed\nbadly")))
    res = run_cli("trace", "info", tmp_path)
    assert res.exit_code == 1 and _one_line(res.stderr) == "error: fit failed badly"


@pytest.mark.parametrize("arg", ["/tmp/\udcff\udcfe", "bad-\udc80-name", "\udcff"])
def test_undecodable_path_in_message_is_printed_escaped(tmp_path, arg):
    res = run_cli("trace", "info", tmp_path / arg)
    assert res.exit_code == 2, res.output
    line = _one_line(res.stderr)
    assert line.startswith("error: ") and "\\x" in line and not any(0xD800 <= ord(c) <= 0xDFFF for c in line)


@pytest.mark.parametrize("arg", ["--rate=\udcff", "--\udcff"])
def test_undecodable_option_value_is_refused_in_one_line(tmp_path, arg):
    refused_cleanly(["replay", "--out", tmp_path / "o", arg], [tmp_path], "latroute replay: ")


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "LATROUTE_DEBUG": ""}


def test_undecodable_path_from_a_real_process(tmp_path):
    """The bytes of argv, not text: a non-UTF-8 path reaches Python as
    surrogate escapes, which a strict stderr could not print."""
    res = subprocess.run([sys.executable, "-m", "harness.cli", "trace", "info", os.fsencode(tmp_path) + b"/\xff\xfe"],
                         capture_output=True, env={**_env(), "LC_ALL": "C.UTF-8"}, timeout=120)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.decode("utf-8").strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "\\xff\\xfe" in lines[0], lines


def test_usage_error_from_a_real_process(tmp_path):
    res = subprocess.run([sys.executable, "-m", "harness.cli", "replay", "--rate", "x", "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, env=_env(), timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["error: latroute replay: --rate: must be a finite number in [0.001, 1e+09] (got x)"]
    assert not (tmp_path / "o").exists()


def test_sigint_during_generate_exits_130_with_one_line(tmp_path):
    """Ctrl-C in the middle of a long ``trace generate``: exit 130, one
    line, no --out. Waits for the work to have started (its staging
    directory appears) so the signal lands in the command, not the imports."""
    out = tmp_path / "big"
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "trace", "generate", "--requests", "3000000",
                             "--rate", "100", "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env())
    try:
        deadline = time.monotonic() + 120
        while not any(tmp_path.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "generate finished before it could be interrupted"
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["interrupted"], err
    assert not out.exists()
