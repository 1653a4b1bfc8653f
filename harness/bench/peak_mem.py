"""Run a module as ``python -m`` would and report the process's own peak
resident memory: ``python -m harness.bench.peak_mem MODULE ARGS...``.

The peak is read from /proc/self/status (VmHWM), which belongs to the
process image after exec; getrusage's maxrss can carry the forking
parent's peak over an exec, which would charge the parent's memory to the
child being measured."""
from __future__ import annotations

import atexit
import runpy
import sys

MARKER = "latroute-peak-rss-kb:"


def vm_hwm_kb() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _report() -> None:
    kb = vm_hwm_kb()
    if kb is not None:
        print(f"{MARKER} {kb}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    module = sys.argv[1]
    sys.argv = [module] + sys.argv[2:]
    atexit.register(_report)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
