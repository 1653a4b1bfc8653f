"""Settings within latroute's documented maxima that need more memory than the machine has are
refused in one line before anything is allocated (``harness.twin.pools.memory``): a pool of 4,096
replicas with prefix caching once ended in a MemoryError, ``--engine num_kv_blocks=2147483647``
allocated 16 GiB first. The available memory is fixed here so the tests do not depend on the
machine's; the last two run ``latroute`` itself under an address-space limit, on a machine whose
memory the settings exceed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from estimators.engine.config import InstanceConfig
from tests.conftest import assert_refused, run_cli

GIB = 2**30
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def memory():
    import harness.twin.pools.memory as memory

    return memory


@pytest.fixture
def sixteen_gib(monkeypatch, memory):
    monkeypatch.setattr(memory, "available_bytes", lambda: 16 * GIB)


def _pool(path, replicas: int, caching: bool = True):
    entry = {"instance_id": "m", "model": "qwen3-8b", "profile": "qwen3-8b-h100", "gpus": 1, "policy": "vllm-v1",
             "max_num_batched_tokens": 8192, "max_num_seqs": 256, "block_size": 16, "num_kv_blocks": 30000,
             "max_model_len": 40960, "price_in": 0.1, "price_out": 0.2, "replicas": replicas,
             "prefix_caching": caching}
    path.write_text(json.dumps({"name": "big", "instances": [entry]}))
    return path


def test_the_estimate_counts_caching_tables_and_blocks(memory):
    off = InstanceConfig(prefix_caching=False, num_kv_blocks=2**31 - 1)
    on = InstanceConfig(prefix_caching=True, num_kv_blocks=30000, max_model_len=40960, block_size=16)
    assert memory.instance_bytes(off) < 1 << 20  # without caching no array grows with the KV size
    assert memory.instance_bytes(on) == 256 * 128 + 256 * 2561 * 8 + 30000 * 128


def test_a_pool_of_4096_caching_replicas_is_refused_before_any_work(tmp_path, sixteen_gib):
    pool = _pool(tmp_path / "big.json", 4096)
    out = tmp_path / "r"
    res = run_cli("replay", "--pool", pool, "--rate", "8", "--requests", "50", "--router", "shortest-queue",
                  "--out", out)
    assert_refused(res, out, f"error: {pool}: instances: 4096 instances (4096 with prefix caching",
                   "need about 34.8 GiB", "above 80% of the 16.0 GiB this machine has available")


def test_pools_that_fit_still_load(tmp_path, sixteen_gib):
    from harness.twin.pools.spec import load_pool

    assert len(load_pool(_pool(tmp_path / "a.json", 64)).instances) == 64
    assert len(load_pool(_pool(tmp_path / "b.json", 4096, caching=False)).instances) == 4096


def test_nothing_is_refused_where_the_machine_does_not_say(monkeypatch, memory):
    monkeypatch.setattr(memory, "available_bytes", lambda: None)
    assert memory.memory_shortfall([InstanceConfig(prefix_caching=True, num_kv_blocks=2**31 - 1)]) is None


@pytest.fixture(scope="module")
def reqstats_trace(tmp_path_factory):
    from tests.test_reqstats_import import _run

    root = tmp_path_factory.mktemp("rs")
    assert run_cli("trace", "import", "vllm-reqstats", _run(root), "--out", root / "t").exit_code == 0
    return root / "t"


@pytest.mark.parametrize("cmd", ["validate", "calibrate"])
def test_the_documented_maximum_kv_size_with_caching_is_refused(reqstats_trace, tmp_path, sixteen_gib, cmd):
    out = tmp_path / ("v" if cmd == "validate" else "p.json")
    args = (["validate", reqstats_trace, "--profile", "qwen3-8b-h100"] if cmd == "validate" else
            ["calibrate", "--from-requests", reqstats_trace])
    res = run_cli(*args, "--engine", "num_kv_blocks=2147483647", "--engine", "prefix_caching=true", "--out", out)
    assert_refused(res, out, "error: --engine: num_kv_blocks=2147483647, prefix caching on: 1 instance",
                   "needs about 256.0 GiB")


def test_a_fleet_too_large_for_memory_blames_replicas(reqstats_trace, tmp_path, sixteen_gib):
    out = tmp_path / "v"
    res = run_cli("validate", reqstats_trace, "--profile", "qwen3-8b-h100", "--replicas", "4096", "--engine",
                  "prefix_caching=true", "--out", out)
    assert_refused(res, out, "error: --replicas: 4096 replicas: 4096 instances")


def _latroute_in_4_gib(*args, cwd: Path) -> subprocess.CompletedProcess:
    """``latroute *args`` in a process whose address space is held to 4 GiB (what it allocates
    past that is a MemoryError, not the machine's memory taken from the other processes)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 * GIB, 4 * GIB))
    return subprocess.run([sys.executable, "-m", "harness.cli", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=300, preexec_fn=limit, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _only_where_it_does_not_fit(need_gib: float) -> None:
    with open("/proc/meminfo") as f:
        have = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:")), None)
    if have is None or need_gib * GIB <= 0.8 * have:
        pytest.skip(f"this machine has the {need_gib} GiB the setting needs: nothing to refuse")


def _refused_in_one_line(r: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    assert all(f in lines[0] for f in fragments), lines[0]


def test_latroute_refuses_a_pool_larger_than_the_machine(tmp_path):
    _only_where_it_does_not_fit(34.8)
    pool = _pool(tmp_path / "big.json", 4096)
    r = _latroute_in_4_gib("replay", "--pool", pool, "--rate", "8", "--requests", "50", "--router",
                           "shortest-queue", "--out", tmp_path / "r", cwd=tmp_path)
    _refused_in_one_line(r, f"error: {pool}: instances: 4096 instances", "this machine has available")
    assert not (tmp_path / "r").exists()


def test_latroute_refuses_the_largest_kv_size_before_allocating_it(reqstats_trace, tmp_path):
    _only_where_it_does_not_fit(256.0)
    r = _latroute_in_4_gib("validate", reqstats_trace, "--profile", "qwen3-8b-h100", "--engine",
                           "num_kv_blocks=2147483647", "--engine", "prefix_caching=true", "--out", tmp_path / "v",
                           cwd=tmp_path)
    _refused_in_one_line(r, "error: --engine: num_kv_blocks=2147483647", "this machine has available")
    assert not (tmp_path / "v").exists()
