"""Settings within latroute's documented maxima that need more memory than the machine has are
refused in one line before anything is allocated (``harness.twin.pools.memory``): a pool of 4,096
replicas with prefix caching once ended in a MemoryError, ``--engine num_kv_blocks=2147483647``
allocated 16 GiB first. The available memory is fixed here so the tests do not depend on the
machine's."""
from __future__ import annotations

import json

import pytest

import harness.twin.pools.memory as memory
from estimators.engine.config import InstanceConfig
from tests.conftest import assert_refused, run_cli

GIB = 2**30


@pytest.fixture
def sixteen_gib(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: 16 * GIB)


def _pool(path, replicas: int, caching: bool = True):
    entry = {"instance_id": "m", "model": "qwen3-8b", "profile": "qwen3-8b-h100", "gpus": 1, "policy": "vllm-v1",
             "max_num_batched_tokens": 8192, "max_num_seqs": 256, "block_size": 16, "num_kv_blocks": 30000,
             "max_model_len": 40960, "price_in": 0.1, "price_out": 0.2, "replicas": replicas,
             "prefix_caching": caching}
    path.write_text(json.dumps({"name": "big", "instances": [entry]}))
    return path


def test_the_estimate_counts_caching_tables_and_blocks():
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


def test_nothing_is_refused_where_the_machine_does_not_say(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda: None)
    assert memory.memory_shortfall([InstanceConfig(prefix_caching=True, num_kv_blocks=2**31 - 1)]) is None


@pytest.fixture(scope="module")
def reqstats_trace(tmp_path_factory):
    from tests.traces.importers.test_reqstats_import import _run

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
