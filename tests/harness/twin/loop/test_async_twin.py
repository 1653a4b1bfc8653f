"""The engine twin under vLLM's async scheduling (the twin loop's async mode, ``harness.twin.loop.kernel``):
what must change against the synchronous loop and what must not.

- decisions: a request waiting for the seat of one that finishes is
  admitted one step later (the plan after the finishing step was made
  before its outputs were applied);
- time: with a host gap g and a device time d per step, the period
  between tokens is max(d, g) under async scheduling, d + g without;
- nothing else: one request and no host gap give the same token times;
  the same seed, the same bytes; the fleet loop runs async and
  synchronous instances side by side (no event skipping on async ones).
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from estimators.engine.config import InstanceConfig
from estimators.timemodel.fit import NoiseModel, StallAllowance
from estimators.timemodel.profile import BatchTimeProfile
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig

ENGINE = InstanceConfig(max_num_batched_tokens=512, max_num_seqs=2, block_size=16, num_kv_blocks=400,
                        max_model_len=4096)


def _profile(gap: float, const: float = 0.01) -> BatchTimeProfile:
    # eq9: const + per-token cost (no context terms), noise model's mean ratio 1 with sigma 0
    return BatchTimeProfile("p", "eq9", np.array([const, 1e-5, 0.0, 0.0]), NoiseModel(), step_gap_s=gap,
                            allowance=StallAllowance(0.0, 5.0))


def _run(reqs: pd.DataFrame, asy: bool, prof: BatchTimeProfile, engine: InstanceConfig = ENGINE, **cfg):
    e = replace(engine, async_scheduling=asy)
    kw = {"noise": False, **cfg}
    return Twin([InstanceSpec(e, prof)], TwinConfig(**kw)).run(reqs, lambda i, t, insts: 0)


def _reqs(prompts, outputs, arrivals=None) -> pd.DataFrame:
    n = len(prompts)
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.zeros(n) if arrivals is None else arrivals,
                         "prompt_tokens": prompts, "output_tokens": outputs})


def _batches(res) -> list[list[int]]:
    items = res.step_items
    return [sorted(g["request_id"].tolist()) for _, g in items.groupby("step", sort=True)]


def test_a_seat_freed_by_a_finish_is_taken_one_step_later():
    """max_num_seqs 2, no host gap: r0 (3 tokens) starts alone (the first
    arrival wakes the engine), r1 (20) joins, r2 waits for r0's seat.
    Synchronously r2 joins the step after r0's last; under async
    scheduling that step was planned before r0's last output was applied
    (r0 skipped: its tokens in flight reach max_tokens), so a step of r1
    alone runs first. r1 also starts a step later (the second plan was made
    at once, before it arrived). Same tokens, one step more: r2's first
    token comes one step constant later."""
    reqs = _reqs([10, 10, 10], [3, 20, 2])
    prof = _profile(0.0)
    sync, asy = _run(reqs, False, prof), _run(reqs, True, prof)
    assert _batches(sync)[:4] == [[0], [0, 1], [0, 1], [1, 2]]
    assert _batches(asy)[:5] == [[0], [0], [0, 1], [1], [1, 2]]
    tt_s, tt_a = sync.requests["ttft_s"].to_numpy(), asy.requests["ttft_s"].to_numpy()
    assert tt_a[0] == pytest.approx(tt_s[0], abs=1e-12)
    assert tt_a[2] - tt_s[2] == pytest.approx(0.01, abs=1e-9)


@pytest.mark.parametrize(("gap", "share"), [(0.004, 0.0), (0.03, 0.0), (0.001, 0.3), (0.01, 0.3)])
def test_the_host_gap_overlaps_the_device(gap, share):
    """One request decoding: each step's time is T = 10.01 ms, of which the
    host's share s prepares the launch, and the host spends g between
    steps. Tokens come every T + g synchronously (the share only splits T)
    and every max((1 - s) T, g + s T) under async scheduling: device-bound
    or host-bound (the last one every max((1 - s) T, g): after it nothing
    is prepared, its tokens in flight reach max_tokens)."""
    reqs = _reqs([10], [12])
    prof = replace(_profile(gap), host_share=share)
    d = 0.01 + 1e-5
    sync, asy = _run(reqs, False, prof), _run(reqs, True, prof)
    r_s, r_a = sync.requests.iloc[0], asy.requests.iloc[0]
    assert sync.requests.equals(_run(reqs, False, _profile(gap)).requests)  # sync: the share changes nothing
    assert (r_s["finish_s"] - r_s["ttft_s"]) / 11 == pytest.approx(d + gap, rel=1e-9)
    period = max((1 - share) * d, gap + share * d)
    assert r_a["finish_s"] - r_a["ttft_s"] == pytest.approx(10 * period + max((1 - share) * d, gap), rel=1e-9)
    assert r_a["ttft_s"] == pytest.approx(gap + 0.01 + 10e-5, abs=1e-12)  # the wake-up gap, then the prefill
    steps = asy.steps
    assert (steps["start_s"].to_numpy()[1:] >= steps["end_s"].to_numpy()[:-1] - 1e-12).all()  # one device


def test_without_a_host_gap_one_request_times_the_same():
    """No host gap, one request: the device runs back to back either way,
    so every token comes at the same time (async changes nothing here)."""
    reqs = _reqs([300], [40])
    prof = _profile(0.0)
    sync, asy = _run(reqs, False, prof), _run(reqs, True, prof)
    for col in ("ttft_s", "finish_s"):
        assert sync.requests[col].to_numpy() == pytest.approx(asy.requests[col].to_numpy(), abs=1e-12)


def test_same_seed_same_bytes_and_fleet_side_by_side():
    """Noise on: the same seed gives identical outcomes; a pool of async and
    synchronous instances (the fleet loop's batched advance, skipping on)
    gives each instance what it gives alone, skipping on or off."""
    rng = np.random.default_rng(3)
    n = 300
    reqs = _reqs(rng.integers(20, 600, n), rng.integers(2, 80, n), np.cumsum(rng.exponential(0.02, n)))
    prof = BatchTimeProfile("p", "eq9", np.array([0.01, 2e-5, 1e-7, 3e-9]),
                            NoiseModel(log_sigma=0.1, p_stall=0.01, stall_excess_mean=2.0), step_gap_s=0.006,
                            allowance=StallAllowance(0.002, 5.0))
    a = _run(reqs, True, prof, noise=True, seed=5)
    b = _run(reqs, True, prof, noise=True, seed=5, skip=False)
    assert a.requests.equals(b.requests)
    specs = [InstanceSpec(replace(ENGINE, instance_id=f"i{k}", max_num_seqs=8, async_scheduling=k % 2 == 1), prof)
             for k in range(4)]
    route = lambda i, t, insts: i % 4  # noqa: E731
    pool = Twin(specs, TwinConfig(noise=True, seed=5)).run(reqs, route)
    alone = Twin(specs, TwinConfig(noise=True, seed=5, skip=False)).run(reqs, route)
    assert pool.requests.equals(alone.requests)
    assert np.isfinite(pool.requests["finish_s"]).all()


def test_host_share_in_the_profile_file(tmp_path):
    """A profile without a host share is written as before (no key) and
    reads back as 0; a share is kept; a share outside [0, 1) is refused."""
    from estimators.timemodel.profile import load_profile
    from traces.errors import BadInput

    plain = _profile(0.001)
    assert "host_share" not in plain.to_json()
    shared = replace(plain, host_share=0.25)
    shared.save(tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json").host_share == 0.25
    doc = shared.to_json()
    doc["host_share"] = 1.0
    with pytest.raises(BadInput, match="host_share"):
        BatchTimeProfile.from_json(doc)


def test_serve_refuses_an_async_instance(tmp_path):
    """``serve`` runs the synchronous loop in real time: a pool with async
    scheduling is refused in one line (exit 2), not served with the wrong
    loop; the offline replay runs it."""
    pytest.importorskip("aiohttp", reason="latroute serve needs the serve extra, refused before its options")
    pytest.importorskip("prometheus_client", reason="latroute serve needs the serve extra, refused before its options")
    import json

    from tests.conftest import assert_refused, run_cli

    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps({"instances": [{"instance_id": "a", "model": "qwen3-8b",
                                               "profile": "qwen3-8b-h100", "async_scheduling": True}]}))
    rec = tmp_path / "rec"
    assert_refused(run_cli("serve", "--pool", pool, "--port-base", "18100", "--record", rec), rec,
                   "--pool", "instance a has async_scheduling on")
    res = run_cli("replay", "--pool", pool, "--rate", "4", "--requests", "60", "--router", "sfs-hard",
                  "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
