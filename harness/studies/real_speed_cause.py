"""How much does a real vLLM CPU server's speed move between runs of the
same workload on this machine, and is it the process or the machine?
(docs/results/serve-faithfulness.md, "Repetition 7 on a slower machine,
and where the drift comes from".)

Why: the real-engine target of docs/results/serve-faithfulness.md compares an emulation fitted
on one real run with two later real runs. If the real server's speed level
moves between runs by more than its per-request scatter, that comparison
is decided by the drift, not by the emulation. This measures the drift
directly: RUNS short real runs (the first N requests of WL, recording
scheduler on, same pinning and settings as ``latroute study serve-real``),
each run's steps against one profile's typical time (median actual /
typical), and, just before each run, a fixed piece of CPU work timed on
the server's core (the machine's own speed at that moment, no vLLM
involved). With ``--thp`` the servers run with PyTorch's
``THP_MEM_ALLOC_ENABLE=1`` (2 MB pages for its large buffers), to see
whether the level is a property of one process's memory layout; the
resident huge pages are sampled every 10 s to show it took effect.

``latroute study real-speed-cause OUT --workload WL --profile P.json --runs 3 [--thp] [--requests 100]``
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from harness.studies import serve_real_faithfulness as srf
from harness.studies.serve_real_drift import ratios

PROBE = """
import time, numpy as np
a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
out = []
for _ in range(5):
    t = time.perf_counter()
    for _ in range(400):
        a @ a
    s = 0
    for i in range(300000):
        s += i
    out.append(time.perf_counter() - t)
    time.sleep(0.5)
print(" ".join(f"{x:.4f}" for x in out))
"""


def probe() -> list[float]:
    """Five timings of the same work on the server's core, one thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    r = subprocess.run(["taskset", "-c", srf.REAL_CORE, sys.executable, "-c", PROBE], env=env,
                       capture_output=True, text=True, timeout=120, check=True)
    return [float(x) for x in r.stdout.split()]


def huge_pages_kb() -> int:
    """AnonHugePages summed over every vLLM process (API server and engine core)."""
    total = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if "vllm" not in Path(f"/proc/{pid}/cmdline").read_text().lower():  # the engine core is "VLLM::EngineCore"
                continue
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("AnonHugePages:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total


def sample_huge_pages(peak: list, stop: threading.Event) -> None:
    """Every 10 s until ``stop``: the largest huge-page total seen, in ``peak[0]``."""
    while not stop.wait(10):
        peak[0] = max(peak[0], huge_pages_kb())


def study(out: Path, workload: Path, profile: Path, runs: int, requests: int, thp: bool, vllm_python: str | None,
          port: int) -> None:
    """``runs`` short real runs, each after the fixed work; one line per run."""
    import numpy as np

    from estimators.timemodel.profile import load_profile

    if thp:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"  # inherited by the servers real_run starts
    prof = load_profile(profile)
    for i in range(runs):
        work = probe()
        d = out.resolve() / f"run{i}"
        peak, stop = [0], threading.Event()
        threading.Thread(target=sample_huge_pages, args=(peak, stop), daemon=True).start()
        try:
            srf.real_run(d, workload.resolve(), requests, vllm_python, port, record=True)
        finally:
            stop.set()
        ratio = ratios(prof, d / "rec.t")
        print(f"run {i}: thp {'on' if thp else 'off'}; fixed work on core {srf.REAL_CORE} before it "
              f"{np.median(work):.3f} s (min {min(work):.3f}, max {max(work):.3f}); steps actual/typical "
              f"median {np.median(ratio):.3f}, mean {ratio.mean():.3f}; "
              f"vLLM huge pages peak {peak[0] / 1024:.0f} MB", flush=True)
