"""The served engine without HTTP, on a hand-driven clock: the same steps as
the offline twin for the same arrivals (noise on: the same draws), an
abort that frees every block and changes the later steps, and the request
parser's refusals."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness.serve.clock import Clock
from harness.serve.engine import ServedEngine
from harness.serve.protocol import ApiError, parse, tokenize
from harness.twin.instance import InstanceSpec, TwinConfig
from harness.twin.pools.spec import load_pool
from harness.twin.simulation import Twin, fixed_router


class HandClock(Clock):
    def __init__(self):
        super().__init__(speed=1.0)
        self.t = 0.0

    def now(self) -> float:
        return self.t


def _spec() -> InstanceSpec:
    return InstanceSpec.from_config(load_pool("qwen3-h100").instances[0])


def _workload(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.cumsum(rng.exponential(0.01, n)),
                         "prompt_tokens": rng.integers(10, 3000, n), "output_tokens": rng.integers(1, 200, n)})


def _serve(req: pd.DataFrame, cfg: TwinConfig, abort_at: dict | None = None) -> ServedEngine:
    clock = HandClock()
    e = ServedEngine(0, _spec(), cfg, clock)
    events = [(t, "arrive", i) for i, t in enumerate(req["arrival_s"])]
    events += [(t, "abort", i) for i, t in (abort_at or {}).items()]
    handles = {}
    for t, kind, i in sorted(events):
        clock.t = t
        e.catch_up(t)
        if kind == "arrive":
            handles[i] = e.submit(f"c{i}", int(req["prompt_tokens"][i]), int(req["output_tokens"][i]))
        else:
            e.abort(handles[i])
    e.catch_up(np.inf)
    return e


@pytest.mark.parametrize("noise", [False, True])
def test_served_steps_are_the_offline_twins(noise):
    req = _workload(120, 4)
    cfg = TwinConfig(seed=7, noise=noise, record_steps=True)
    e = _serve(req, cfg)
    e.inst.flush_log()
    served = e.inst.step_log(np.arange(len(req)))
    offline = Twin([_spec()], cfg).run(req, fixed_router(np.zeros(len(req), dtype=np.int64)))
    pd.testing.assert_frame_equal(served.steps, offline.log.steps)
    pd.testing.assert_frame_equal(served.step_items, offline.log.step_items)
    first = np.array([h.first_t for h in e.requests])
    np.testing.assert_array_equal(first - req["arrival_s"].to_numpy() + 0.0,
                                  offline.requests["ttft_s"].to_numpy())
    assert all(h.delivered == o for h, o in zip(e.requests, req["output_tokens"]))


def test_abort_frees_blocks_and_changes_later_steps():
    req = _workload(30, 5)
    cfg = TwinConfig(seed=1, noise=False, record_steps=True)
    plain = _serve(req, cfg)
    t_mid = float(req["arrival_s"].iloc[10])
    cut = _serve(req, cfg, abort_at={3: t_mid, 4: t_mid})
    gone = [cut.requests[3], cut.requests[4]]
    assert [h.finish_reason for h in gone] == ["abort", "abort"] and all(0 < h.delivered < 200 for h in gone)
    assert cut.free_blocks() == plain.free_blocks() == cut.inst.spec.config.num_kv_blocks - 1
    assert cut.kv_usage() == 0.0 and cut.running == 0 and cut.waiting == 0
    cut.inst.flush_log()
    plain.inst.flush_log()
    a = cut.inst.step_log(np.arange(30)).step_items
    b = plain.inst.step_log(np.arange(30)).step_items
    assert len(a) < len(b)  # the aborted requests' later steps are gone
    last = a[a["request_id"].isin([3, 4])]["step"].max()
    assert not a[(a["step"] > last) & a["request_id"].isin([3, 4])].size


def test_parse_refuses_as_vllm():
    assert tokenize("w12 w55 hello w9999") == [12, 55, 0, 0]
    p = parse({"prompt": "w1 w2 w3"}, False, "m", 100)
    assert p.prompt_ids == [1, 2, 3] and p.max_tokens == 97  # default: up to max_model_len
    for body, param in [({"prompt": []}, "prompt"), ({"prompt": [1], "max_tokens": 100}, "max_tokens"),
                        ({"prompt": [1], "stream_options": {"include_usage": True}}, "stream_options"),
                        ({"prompt": [1], "n": 2}, "n"), ({"prompt": ["w1", "w2"]}, "prompt"),
                        ({"messages": "hi"}, "messages")]:
        with pytest.raises(ApiError) as e:
            parse(body, "messages" in body, "m", 100)
        assert e.value.param == param and e.value.body()["error"]["code"] == 400
