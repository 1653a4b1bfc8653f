"""latroute commands as child processes for benchmarks and studies that
need real servers: started until they say ``ready``, stopped by SIGTERM,
loadgen run to the end; every wait bounded."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

START_S = 180.0  # a cold Numba cache compiles the kernels first


def start_ready(args: list[str], cwd: Path, timeout: float = START_S) -> subprocess.Popen:
    """``latroute ARGS`` in ``cwd``, once it printed a line starting ``ready``."""
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    for line in p.stdout:
        if line.startswith("ready"):
            return p
        if time.monotonic() > deadline:
            break
    p.kill()
    raise RuntimeError(f"{args[0]} did not start: {p.stderr.read()}")


def stop(p: subprocess.Popen, timeout: float = 60.0) -> str:
    """SIGTERM, then its remaining stdout."""
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=timeout)
    return out


def loadgen(cwd: Path, out: Path, target: list[str], extra: list[str], timeout: float = 900.0) -> dict:
    """``latroute loadgen TARGET EXTRA --out OUT``; its bench.json."""
    r = subprocess.run([sys.executable, "-m", "harness.cli", "loadgen", *target, "--out", str(out), "--force",
                        "--time-limit", str(int(timeout) - 60), *extra], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"loadgen failed: {r.stderr}")
    return json.loads((out / "bench.json").read_text())


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
