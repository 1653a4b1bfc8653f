"""Adversarial outputs: what ``--out`` and ``--force`` may touch.

Every writing command against every kind of place it must not write or
replace (devices, pipes, sockets, links, user files and directories, ``.``
and its parents, its own input, /proc and /sys, a parent that is a file,
names too long, a locked output...): one ``error:`` line, exit 2, nothing
changed. Then what it may do: replace its own marked output with
``--force``, remove killed runs' debris and leave live runs' alone, refuse
a second writer, honour the umask.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.adversarial import refused_cleanly
from tests.conftest import run_cli
from traces.errors import BadInput

# written out, not imported, so these tests also run (and fail) against code without them
MARKER = ".latroute"
JSON_MARKER = "latroute_output"


@pytest.fixture(autouse=True)
def no_hang():
    """A refusal is immediate: a case still running after 60 s (e.g. blocked
    opening a pipe) fails instead of hanging the suite."""
    def expired(signum, frame):
        raise TimeoutError("still running after 60 s: blocked on a pipe or device?")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="module")
def wl(tmp_path_factory) -> Path:
    """A small generated trace: the input every command reads."""
    out = tmp_path_factory.mktemp("inputs") / "wl"
    res = run_cli("trace", "generate", "--out", out, "--requests", "20", "--rate", "5")
    assert res.exit_code == 0, res.output
    return out


def _csv(inp: Path) -> Path:
    return inp.parent / "az.csv"


# command name -> (kind of output, args given (out, input, force flag))
COMMANDS: dict[str, tuple[str, Callable[[Path, Path, list[str]], list]]] = {
    "trace generate": ("dir", lambda o, i, f: ["trace", "generate", "--requests", "20", "--rate", "5",
                                               "--lengths-from", i, "--out", o, *f]),
    "trace import": ("dir", lambda o, i, f: ["trace", "import", "azure", i, "--out", o, *f]),
    "trace join": ("dir", lambda o, i, f: ["trace", "join", i, i, "--out", o, *f]),
    "calibrate": ("file", lambda o, i, f: ["calibrate", i, "--out", o, *f]),
    "validate": ("dir", lambda o, i, f: ["validate", i, "--profile", "qwen3-0.6b-h100", "--out", o, *f]),
    "estimate": ("dir", lambda o, i, f: ["estimate", i, "--out", o, *f]),
    "replay": ("dir", lambda o, i, f: ["replay", "--trace", i, "--router", "shortest-queue", "--out", o, *f]),
    "sweep": ("dir", lambda o, i, f: ["sweep", "--trace", i, "--rates", "4", "--routers", "shortest-queue",
                                      "--requests", "20", "--workers", "1", "--out", o, *f]),
    "report": ("dir", lambda o, i, f: ["report", i, "--out", o, *f]),
    "check --write-baseline": ("file", lambda o, i, f: ["check", i, "--baseline", o, "--write-baseline", *f]),
    "loadgen": ("dir", lambda o, i, f: ["loadgen", "--base-url", "http://127.0.0.1:9", "--trace", i, "--out", o,
                                        *f]),
    "record engine": ("dir", lambda o, i, f: ["record", "engine", i, "--model", i, "--out", o, *f]),
}


def _marked_dir(p: Path, kind: str = "trace") -> Path:
    p.mkdir()
    (p / MARKER).write_text(f"{kind}\n")
    (p / "meta.json").write_text("{}\n")
    return p


def _marked_json(p: Path) -> Path:
    p.write_text(json.dumps({JSON_MARKER: "profile", "x": 1}) + "\n")
    return p


class Case:
    """Where one case points --out, whether it passes --force, and what the refusal must say."""

    def __init__(self, out: Path | str, force: bool, *fragments: str):
        self.out, self.force, self.fragments = out, force, fragments


def _chardev(tmp: Path, inp: Path, kind: str) -> Case:
    p = tmp / "null"
    try:
        os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod of a character device needs root")
    return Case(p, True, "character device")


def _fifo(tmp: Path, inp: Path, kind: str) -> Case:
    os.mkfifo(tmp / "pipe")
    return Case(tmp / "pipe", True, "named pipe")


def _socket(tmp: Path, inp: Path, kind: str) -> Case:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(tmp)  # a relative bind: AF_UNIX paths are limited to 108 bytes
    try:
        s.bind("sock")
    finally:
        os.chdir(cwd)
        s.close()
    return Case(tmp / "sock", True, "socket")


def _symlink(tmp: Path, inp: Path, kind: str) -> Case:
    target = _marked_dir(tmp / "real") if kind == "dir" else _marked_json(tmp / "real.json")
    (tmp / "link").symlink_to(target)
    return Case(tmp / "link", True, "symbolic link")


def _user_file(tmp: Path, inp: Path, kind: str) -> Case:
    (tmp / "notes.txt").write_text("keep me\n")
    return Case(tmp / "notes.txt", True, "is a file" if kind == "dir" else "not written by latroute")


def _user_json(tmp: Path, inp: Path, kind: str) -> Case:
    (tmp / "mine.json").write_text('{"name": "mine"}\n')
    return Case(tmp / "mine.json", True, "is a file" if kind == "dir" else "not written by latroute")


def _foreign_dir(tmp: Path, inp: Path, kind: str) -> Case:
    d = tmp / "project"
    (d / ".git").mkdir(parents=True)
    (d / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (d / "main.py").write_text("print('hello')\n")
    return Case(d, True, "not written by" if kind == "dir" else "is a directory")


def _cwd(tmp: Path, inp: Path, kind: str) -> Case:
    (tmp / "keep.txt").write_text("x")
    os.chdir(tmp)
    return Case(".", True, "working directory")


def _cwd_parent(tmp: Path, inp: Path, kind: str) -> Case:
    (tmp / "sub").mkdir()
    os.chdir(tmp / "sub")
    return Case("..", True, "working directory")


def _the_input(tmp: Path, inp: Path, kind: str) -> Case:
    return Case(inp, True, "the input")


def _inside_input(tmp: Path, inp: Path, kind: str) -> Case:
    return Case(inp / ("sub.json" if kind == "file" else "sub"), True, "the input")


def _proc(tmp: Path, inp: Path, kind: str) -> Case:
    return Case("/proc/latroute-adversarial-out", True, "/proc")


def _sys(tmp: Path, inp: Path, kind: str) -> Case:
    return Case("/sys/latroute-adversarial-out", False, "/sys")


def _parent_is_file(tmp: Path, inp: Path, kind: str) -> Case:
    (tmp / "plain").write_text("x")
    return Case(tmp / "plain" / "out", False, "is not a directory")


def _too_long(tmp: Path, inp: Path, kind: str) -> Case:
    return Case(tmp / ("x" * 300), False, "too long")


def _unwritable(tmp: Path, inp: Path, kind: str) -> Case:
    if os.geteuid() == 0:
        pytest.skip("root writes into a read-only directory")
    (tmp / "ro").mkdir()
    os.chmod(tmp / "ro", 0o500)
    return Case(tmp / "ro" / "out", False, "cannot write")


def _ours_without_force(tmp: Path, inp: Path, kind: str) -> Case:
    out = _marked_dir(tmp / "prev") if kind == "dir" else _marked_json(tmp / "prev.json")
    return Case(out, False, "--force" if kind == "dir" else "already exists")


def _wrong_kind_of_ours(tmp: Path, inp: Path, kind: str) -> Case:
    if kind == "dir":
        return Case(_marked_json(tmp / "prev.json"), True, "is a file")
    return Case(_marked_dir(tmp / "prev"), True, "is a directory")


def _locked(tmp: Path, inp: Path, kind: str) -> Case:
    out = tmp / ("busy.json" if kind == "file" else "busy")
    from traces.files.outputs import OutputLock

    _locked.held = OutputLock(out)  # released in the test's teardown
    return Case(out, False, "another latroute run is writing", f"pid {os.getpid()}")


TARGETS = {f.__name__.lstrip("_"): f for f in (
    _chardev, _fifo, _socket, _symlink, _user_file, _user_json, _foreign_dir, _cwd, _cwd_parent, _the_input,
    _inside_input, _proc, _sys, _parent_is_file, _too_long, _unwritable, _ours_without_force, _wrong_kind_of_ours,
    _locked)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("command", COMMANDS)
def test_out_refused_before_any_work(command, target, tmp_path, wl, monkeypatch):
    kind, build = COMMANDS[command]
    inp = tmp_path / "input"
    subprocess.run(["cp", "-a", str(wl), str(inp)], check=True)
    monkeypatch.chdir(os.getcwd())  # restored after the cases that change directory
    case = TARGETS[target](tmp_path, inp, kind)
    try:
        refused_cleanly(build(case.out, inp, ["--force"] if case.force else []), [tmp_path], *case.fragments)
    finally:
        held = getattr(_locked, "held", None)
        if held is not None:
            held.release()
            _locked.held = None


# ---------------------------------------------------------------- what --force may do


def test_force_replaces_only_its_own_output_and_leaves_no_debris(tmp_path):
    out = tmp_path / "wl"
    assert run_cli("trace", "generate", "--out", out, "--requests", "20", "--rate", "5").exit_code == 0
    assert (out / MARKER).read_text().strip()
    res = run_cli("trace", "generate", "--out", out, "--requests", "30", "--rate", "5", "--force")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "meta.json").read_text())["tables"]["requests"] == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wl"]  # no .wl.old-*, .wl.tmp-*, .wl.lock


def test_an_empty_plain_directory_is_used_without_force(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert run_cli("trace", "generate", "--out", out, "--requests", "20", "--rate", "5").exit_code == 0
    assert (out / "requests.parquet").is_file()


def test_a_profile_carries_the_marker_and_force_replaces_only_a_marked_one(tmp_path):
    from estimators.timemodel.profile import load_profile

    prof = load_profile("qwen3-0.6b-h100")
    path = tmp_path / "p.json"
    prof.save(path)
    assert json.loads(path.read_text())[JSON_MARKER] == "profile"
    assert load_profile(path).coefficients.tolist() == prof.coefficients.tolist()
    prof.save(path, force=True)  # its own file: replaced
    with pytest.raises(BadInput, match="already exists"):
        prof.save(path, force=False)
    mine = tmp_path / "mine.json"
    mine.write_text('{"mine": true}\n')
    with pytest.raises(BadInput, match="not written by latroute"):
        prof.save(mine, force=True)
    assert mine.read_text() == '{"mine": true}\n'


def test_estimate_onto_its_own_input_is_refused_and_the_input_survives(tmp_path, wl):
    """The reproduction: ``estimate n_self --out n_self --force``."""
    n_self = tmp_path / "n_self"
    subprocess.run(["cp", "-a", str(wl), str(n_self)], check=True)
    refused_cleanly(["estimate", n_self, "--out", n_self, "--force"], [tmp_path], "the input")
    assert (n_self / "requests.parquet").is_file()
