"""``InstanceConfig``: one set of defaults, instances rows and pool files;
``watermark`` shows an engine setting reaching the twin, SFS and the
state rebuilder from a pool file through this one module."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from estimators.engine.config import InstanceConfig
from estimators.engine.layout import C_WATERMARK
from estimators.engine.view import InstanceView
from estimators.snapshot import RecordedWalk
from harness.twin.pools.spec import load_pool
from harness.twin.simulation import Twin, TwinConfig, fixed_router, write_twin_trace
from traces.errors import BadInput
from traces.store import TraceWriter, open_trace


def test_instance_config_round_trips_through_an_instances_row():
    cfg = InstanceConfig(instance_id="a", model="m", profile="p.json", policy="sarathi", max_num_batched_tokens=4096,
                         max_num_seqs=64, num_kv_blocks=777, watermark=0.05, max_model_len=8192, price_in=0.1)
    assert InstanceConfig.from_row(cfg.to_row()) == cfg
    # empty cells take the defaults (a recording that does not say its max_model_len writes 0)
    assert InstanceConfig.from_row({"instance_id": "b", "max_model_len": 0, "watermark": float("nan")}) == \
        InstanceConfig(instance_id="b")


def test_defaults_are_vllm_serve_defaults():
    c = InstanceConfig()
    assert (c.max_num_batched_tokens, c.max_num_seqs, c.block_size, c.chunked_prefill) == (2048, 256, 16, True)
    assert c.long_prefill_token_threshold == 0 and c.watermark_fraction == 0.0  # V1 keeps no watermark
    assert InstanceConfig(policy="sarathi").watermark_fraction == 0.01


def test_bad_settings_are_refused_from_a_pool_file(tmp_path):
    path = tmp_path / "pool.json"
    path.write_text(json.dumps({"instances": [{"instance_id": "a", "model": "m", "profile": "qwen3-8b-h100",
                                               "watermark": 1.5}]}))
    with pytest.raises(BadInput, match="watermark"):
        load_pool(path)


def test_watermark_from_a_pool_file_reaches_the_twin_the_trace_and_the_rebuilt_state(tmp_path):
    def pool(watermark):
        inst = {"instance_id": "a", "model": "m", "profile": "qwen3-8b-h100", "max_num_batched_tokens": 1024,
                "max_num_seqs": 64, "num_kv_blocks": 200}
        if watermark is not None:
            inst["watermark"] = watermark
        path = tmp_path / f"pool-{watermark}.json"
        path.write_text(json.dumps({"name": "p", "instances": [inst]}))
        return load_pool(path)

    n = 40
    reqs = pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.arange(n) * 0.002,
                         "prompt_tokens": np.full(n, 300), "output_tokens": np.full(n, 100)})
    route = fixed_router(np.zeros(n, dtype=int))
    runs = {}
    for wm in (None, 0.25):
        res = Twin.from_pool(pool(wm), TwinConfig(noise=False)).run(reqs, route)
        with TraceWriter(tmp_path / f"t{wm}") as w:
            write_twin_trace(w, res)
        runs[wm] = res
    # 25% of 200 blocks kept free at admission: fewer requests run at once, so TTFTs grow
    assert runs[0.25].requests["ttft_s"].mean() > runs[None].requests["ttft_s"].mean()
    tr = open_trace(tmp_path / "t0.25")
    row = tr.read("instances").iloc[0]
    assert row["watermark"] == 0.25
    walk = RecordedWalk(tr, "a")
    assert walk.engine.watermark == 0.25 and walk.state.cfg[C_WATERMARK] == 50
    assert pd.isna(open_trace(tmp_path / "tNone").read("instances").iloc[0]["watermark"])


def test_a_snapshot_and_a_live_instance_are_both_instance_views(tmp_path):
    seen = []

    def on_arrival(i, t, insts):
        seen.extend([insts[0], insts[0].snapshot(t)])

    reqs = pd.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [10], "output_tokens": [2]})
    Twin.from_pool(load_pool("qwen3-h100")).run(reqs, lambda i, t, insts: 0, on_arrival=on_arrival)
    assert all(isinstance(v, InstanceView) for v in seen)
