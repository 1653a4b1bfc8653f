"""Adversarial outputs, second part: two writers to one ``--out``,
debris of killed runs, the umask, and sweeps' outputs (split from
test_adversarial_outputs.py, which keeps what ``--out`` and ``--force`` may
touch).
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tests.adversarial import refused_cleanly
from tests.conftest import run_cli
from tests.test_adversarial_outputs import _marked_dir, no_hang  # noqa: F401 (no_hang: the autouse time limit)
from traces.errors import BadInput

# ---------------------------------------------------------------- lock


def test_two_writers_to_one_out_cannot_race(tmp_path):
    from traces.files.outputs import StagedDir

    out = tmp_path / "t"
    first = StagedDir(out)
    with pytest.raises(BadInput, match=f"another latroute run is writing .* \\(pid {os.getpid()}\\)"):
        StagedDir(out)
    with first as tmp:
        (tmp / "a").write_text("a")
    second = StagedDir(out, force=True)  # the lock went with the rename
    second.abort()
    assert (out / "a").read_text() == "a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t"]


def test_a_second_process_is_refused_while_the_first_writes(tmp_path):
    out = tmp_path / "t"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from traces.files.outputs import OutputLock; "
                               f"OutputLock(__import__('pathlib').Path({str(out)!r})); print('held', flush=True); "
                               "time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert holder.stdout.readline().strip() == "held"
        refused_cleanly(["trace", "generate", "--out", out, "--requests", "20", "--rate", "5"], [tmp_path],
                        "another latroute run is writing", f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()
    res = run_cli("trace", "generate", "--out", out, "--requests", "20", "--rate", "5")  # the kernel freed the lock
    assert res.exit_code == 0, res.output


# ---------------------------------------------------------------- debris


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_debris_of_killed_runs_is_removed_and_live_runs_are_left_alone(tmp_path):
    dead = _dead_pid()
    (tmp_path / f".wl.tmp-{dead}-abcd").mkdir()
    (tmp_path / f".wl.tmp-{dead}-abcd" / "requests.parquet").write_bytes(b"x" * 100)
    (tmp_path / f".wl.old-{dead}").mkdir()
    live = tmp_path / f".wl.tmp-{os.getpid()}-live"
    live.mkdir()
    other = tmp_path / f".other.tmp-{dead}-zz"
    other.mkdir()
    res = run_cli("trace", "generate", "--out", tmp_path / "wl", "--requests", "20", "--rate", "5")
    assert res.exit_code == 0, res.output
    notes = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(notes) == 1 and "removed 2 leftover" in notes[0] and str(dead) in notes[0], notes
    assert live.is_dir() and other.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name, "wl"])


def test_a_refused_run_removes_no_debris(tmp_path):
    dead = _dead_pid()
    (tmp_path / f".wl.tmp-{dead}-abcd").mkdir()
    (tmp_path / "wl").write_text("user file\n")
    refused_cleanly(["trace", "generate", "--out", tmp_path / "wl", "--requests", "20", "--rate", "5", "--force"],
                    [tmp_path], "is a file")


# ---------------------------------------------------------------- umask


@pytest.mark.parametrize("umask,dir_mode,file_mode", [(0o022, 0o755, 0o644), (0o077, 0o700, 0o600),
                                                      (0o002, 0o775, 0o664)])
def test_outputs_respect_the_umask(tmp_path, umask, dir_mode, file_mode):
    from traces.files.outputs import StagedDir, write_json

    old = os.umask(umask)
    try:
        assert run_cli("trace", "generate", "--out", tmp_path / "wl", "--requests", "20", "--rate", "5"
                       ).exit_code == 0
        from estimators.timemodel.profile import load_profile
        load_profile("qwen3-0.6b-h100").save(tmp_path / "p.json")
        with StagedDir(tmp_path / "r") as tmp:
            write_json(tmp / "metrics.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "wl").st_mode) == dir_mode
    for f in (tmp_path / "wl").iterdir():
        assert stat.S_IMODE(os.stat(f).st_mode) == file_mode, f
    assert stat.S_IMODE(os.stat(tmp_path / "p.json").st_mode) == file_mode
    assert stat.S_IMODE(os.stat(tmp_path / "r").st_mode) == dir_mode
    assert stat.S_IMODE(os.stat(tmp_path / "r" / "metrics.json").st_mode) == file_mode


# ---------------------------------------------------------------- sweeps


@pytest.mark.parametrize("workers", ["0", "-1", str((os.cpu_count() or 1) + 1), "10000"])
def test_sweep_workers_out_of_range_are_refused(tmp_path, workers):
    refused_cleanly(["sweep", "--rates", "4", "--routers", "shortest-queue", "--requests", "20", "--workers", workers,
                     "--out", tmp_path / "s"], [tmp_path], "--workers")


def test_sweep_refuses_another_kind_of_latroute_output_without_force(tmp_path):
    _marked_dir(tmp_path / "s", "trace")
    refused_cleanly(["sweep", "--rates", "4", "--routers", "shortest-queue", "--requests", "20", "--workers", "1",
                     "--resume", "--out", tmp_path / "s"], [tmp_path], "not a sweep")


def test_sweep_spec_with_nan_on_disk_is_refused_on_resume(tmp_path):
    s = _marked_dir(tmp_path / "s", "sweep")
    (s / "INCOMPLETE").write_text("")
    (s / "sweep.json").write_text('{"spec_version": NaN}\n')
    refused_cleanly(["sweep", "--rates", "4", "--routers", "shortest-queue", "--requests", "20", "--workers", "1",
                     "--resume", "--out", s], [tmp_path], "sweep.json", "strict JSON")


def test_check_out_refuses_nul_and_empty_names():
    from traces.files.outputs import check_out

    for bad, frag in (("", "empty"), ("a\0b", "NUL")):
        with pytest.raises(BadInput, match=frag):
            check_out(bad)
