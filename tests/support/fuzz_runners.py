"""How the fuzzers run a command: in process for the commands
that run no compiled code, in a child process with a deadline, or in a
long-lived worker process that dies alone when a command corrupts the heap.

Split from tests/support/fuzz_corruptors.py (the corruptors and the promise) to keep each
module under the house's 400 lines; tests/support/fuzz_corruptors.py re-exports these.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO, SHARED_DATA


@dataclass
class Outcome:
    code: int  # negative: killed by that signal; None-like 999: hung (killed at the deadline)
    stdout: str
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


HUNG = 999


def in_process(args: list) -> Outcome:
    """Run ``latroute *args`` in this process (for commands that run no kernel)."""
    from tests.conftest import run_cli
    res = run_cli(*args)
    return Outcome(res.exit_code, res.stdout, res.stderr)


def subprocess_run(args: list, timeout: float = 60.0, env: dict | None = None) -> Outcome:
    """Run ``latroute *args`` in a child process with a deadline; a hang is
    killed (its whole process group) and reported as ``HUNG``."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "LATROUTE_SHARED_DATA": str(SHARED_DATA), **(env or {})}
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=full_env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return Outcome(HUNG, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))
    return Outcome(p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"))


class Worker:
    """One child process that runs many CLI invocations in-process (the
    import and Numba compile cost paid once) and dies alone when a command
    corrupts the heap: the case that killed it is reported as a crash and
    the next case gets a fresh worker."""

    def __init__(self, extra_path: Path | None = None) -> None:
        self.extra_path = extra_path  # a directory of plug-in modules to import from
        self.proc: subprocess.Popen | None = None
        self.since_start: list[str] = []  # the cases this worker ran, for a crash seen late

    def run_confirmed(self, args: list, timeout: float = 120.0, label: str = "") -> Outcome:
        """``run``, and a crash re-run in a fresh worker: heap corruption may
        surface a case later than the one that caused it. A crash that does
        not reproduce alone is still reported (something wrote past a
        buffer), naming the cases that ran in the dead worker."""
        history = list(self.since_start)
        o = self.run(args, timeout, label)
        if o.code >= 0 or o.code == HUNG:
            return o
        _remove_output(args)
        again = self.run(args, timeout, label)
        if again.code < 0 and again.code != HUNG:
            return again
        earlier = "; ".join(history[-3:])
        return Outcome(o.code, o.stdout, o.stderr + f"\n(not reproduced alone; the heap was corrupted by an "
                                                   f"earlier case of this worker: {earlier[-300:]})")

    def _start(self) -> None:
        path = str(REPO) if self.extra_path is None else f"{REPO}{os.pathsep}{self.extra_path}"
        env = {**os.environ, "PYTHONPATH": path, "LATROUTE_SHARED_DATA": str(SHARED_DATA)}
        # the child's own stderr (C-level aborts: "malloc(): ...") to a file, never a pipe that could fill
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-c", "from tests.support.fuzz_runners import worker_main; worker_main()"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
                                     env=env, start_new_session=True, cwd=str(REPO))
        self.since_start = []

    def run(self, args: list, timeout: float = 120.0, label: str = "") -> Outcome:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        p = self.proc
        assert p is not None and p.stdin is not None and p.stdout is not None
        self.since_start.append(label or " ".join(map(str, args[:2])))
        p.stdin.write((json.dumps([str(a) for a in args]) + "\n").encode())
        p.stdin.flush()
        ready, _, _ = select.select([p.stdout], [], [], timeout)
        if not ready:
            self.close()
            return Outcome(HUNG, "", f"hung for {timeout} s")
        line = p.stdout.readline()
        if not line:  # died: heap corruption, a segfault, an abort
            code = p.wait()
            self.err.seek(0)
            err = self.err.read().decode("utf-8", "replace")
            self.proc = None
            return Outcome(code if code < 0 else -abs(code) or -1, "", err[-3000:])
        res = json.loads(line)
        return Outcome(res["code"], res["stdout"], res["stderr"])

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None


def _remove_output(args: list) -> None:
    """What a crashed run left at its ``--out`` (and its temporaries), so the
    re-run meets the same state as the first."""
    args = [str(a) for a in args]
    if "--out" not in args:
        return
    out = Path(args[args.index("--out") + 1])
    for p in [out, *(out.parent.glob(f".{out.name}.*") if out.parent.exists() else [])]:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        elif os.path.lexists(p):
            p.unlink()


def _clip(text: str) -> str:
    """Output small enough to pass back, every line kept (their count is
    judged), each cut to 2,000 characters."""
    lines = text.splitlines()
    keep = lines if len(lines) <= 200 else lines[:100] + lines[-100:]
    return "\n".join(ln[:2000] for ln in keep)


def worker_main() -> None:
    """The worker's loop: one JSON list of arguments per line in, one JSON
    result per line out."""
    from tests.conftest import run_cli
    for line in sys.stdin:
        res = run_cli(*json.loads(line))
        sys.stdout.write(json.dumps({"code": res.exit_code, "stdout": _clip(res.stdout),
                                     "stderr": _clip(res.stderr)}) + "\n")
        sys.stdout.flush()


