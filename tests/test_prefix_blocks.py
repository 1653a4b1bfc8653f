"""Trace hash ids to engine block ids: same block size, a hash block split
into engine blocks (Mooncake's 512 onto 128), engine blocks spanning hash
blocks, and only full engine blocks counted."""
from __future__ import annotations

import numpy as np
import pytest

from estimators.engine.block_ids import OWN_BASE
from traces.datamodel.prefix_blocks import (
    MAX_TRACE_ID,
    engine_block_ids,
    flat_block_ids,
    ideal_hit_tokens,
    parse_id_list,
)


def test_same_size_keeps_full_blocks_only():
    assert engine_block_ids([5, 6, 7], 128, 300, 128).tolist() == [5, 6]  # 300 tokens: 2 full blocks


def test_split_512_into_128_is_a_bijection_and_stops_at_the_last_full_block():
    a = engine_block_ids([0, 1], 512, 512 + 300, 128)  # the second 512-block holds 300 tokens: 2 full
    assert a.tolist() == [0, 1, 2, 3, 4, 5]
    b = engine_block_ids([1, 0], 512, 1024, 128)
    assert set(a[4:]) == set(b[:2]) and len(set(b)) == 8  # same id, same blocks; distinct otherwise
    assert engine_block_ids([0], 512, 100, 128).size == 0


def test_engine_block_spanning_hash_blocks_takes_the_last_id():
    assert engine_block_ids([1, 2, 3, 4, 9], 128, 640, 512).tolist() == [4]
    with pytest.raises(ValueError, match="divide"):
        engine_block_ids([1], 100, 300, 128)


def test_trace_ids_stay_below_the_requests_own_ids():
    assert MAX_TRACE_ID < OWN_BASE
    with pytest.raises(ValueError):
        parse_id_list(str(1 << 62))
    with pytest.raises(ValueError, match="too large"):
        engine_block_ids([MAX_TRACE_ID // 2], 512, 1024, 128)
    assert parse_id_list("3 4") == [3, 4] and parse_id_list("") == [] and parse_id_list(float("nan")) is None


def test_flat_ids_and_ideal_hit():
    flat, off, cnt = flat_block_ids([[1, 2], None, [1, 3]], np.array([256, 500, 300]), 128, 128)
    assert flat.tolist() == [1, 2, 1, 3] and off.tolist() == [0, 2, 2] and cnt.tolist() == [2, 0, 2]
    hit, total = ideal_hit_tokens([[1, 2], None, [1, 2, 4], [1, 5]], [256, 500, 400, 300], 128)
    assert (hit, total) == (256 + 128, 256 + 500 + 400 + 300)


def test_mooncake_ids_replay_on_a_twin_with_caching(tmp_path):
    """Mooncake's 512-token ids on an engine of 128-token blocks: a request
    sharing two whole 512-blocks with an earlier one hits 1024 tokens; its
    partial last 512-block counts only for its full 128-token blocks."""
    import json

    import pandas as pd

    from estimators.engine.config import InstanceConfig
    from estimators.timemodel.fit import NoiseModel
    from estimators.timemodel.profile import BatchTimeProfile
    from harness.twin.simulation import InstanceSpec, Twin, TwinConfig
    from tests.conftest import run_cli
    from traces.store import open_trace

    rows = [{"timestamp": 0, "input_length": 1400, "output_length": 2, "hash_ids": [0, 1, 2]},
            {"timestamp": 2000, "input_length": 1600, "output_length": 2, "hash_ids": [0, 1, 3, 4]},
            {"timestamp": 4000, "input_length": 1300, "output_length": 2, "hash_ids": [0, 1, 2]}]
    src = tmp_path / "m.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert run_cli("trace", "import", "mooncake", src, "--out", tmp_path / "t").exit_code == 0
    t = open_trace(tmp_path / "t")
    reqs = t.read("requests")
    prof = BatchTimeProfile("p", "eq9", np.array([1e-3, 1e-6, 0.0, 0.0]), NoiseModel(log_sigma=0.01))
    spec = InstanceSpec(InstanceConfig(block_size=128, num_kv_blocks=200, max_num_batched_tokens=2048,
                                       max_model_len=4096, prefix_caching=True), prof)
    res = Twin([spec], TwinConfig(noise=False)).run(pd.DataFrame(reqs), lambda i, t, insts: 0,
                                                    hash_block_tokens=t.meta["hash_block_tokens"])
    # request 0 registers 10 full blocks of 128 (1400 tokens: ids 0-1 whole, id 2 for 2 blocks of 128)
    assert res.requests["cached_tokens"].tolist() == [0, 1024, 1280]
