"""The fleet loop (event queue, incremental views) changes no
result byte.

Each cell replays a small Poisson workload through ``replay`` and hashes
every column of the served requests (and, where recorded, the step log);
the expected digests were computed by latroute at commit 8d9f8d7, before the event
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
    from harness.twin.pools.spec import load_pool
    from harness.twin.replay import ReplayConfig, replay
    from traces.workload.arrivals import ArrivalSpec
    from traces.workload.generator import WorkloadConfig, generate_workload

    pool, router, rate, n, noise, interval, steps = CELLS[name]
    wl = generate_workload(WorkloadConfig(requests=n, arrivals=ArrivalSpec("poisson", rate), seed=3))
    res = replay(load_pool(pool), pool, wl.requests, wl.quality,
                 ReplayConfig(router=router, seed=5, noise=noise, view_interval_ms=interval, record_steps=steps,
                              ties="lowest-index"))  # the one-level loop's one replica order
    parts = [digest_frame(res.requests), str(res.twin.steps_run)]
    if steps:
        parts += [digest_frame(res.twin.steps), digest_frame(res.twin.step_items)]
    return "/".join(parts)


EXPECTED = {  # latroute at commit 8d9f8d7
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


def toy_specs(n: int, caching: bool = False):
    from estimators.engine.config import InstanceConfig
    from estimators.timemodel.fit import NoiseModel
    from estimators.timemodel.profile import BatchTimeProfile
    from harness.twin.simulation import InstanceSpec

    prof = BatchTimeProfile("toy", "eq9", np.array([2e-3, 2e-6, 0.0, 0.0]), NoiseModel(log_sigma=0.2))
    return [InstanceSpec(InstanceConfig(instance_id=f"i{k}", model=f"m{k % 3}", max_num_batched_tokens=256,
                                        max_num_seqs=6, num_kv_blocks=200, max_model_len=320,
                                        prefix_caching=caching and k % 2 == 0), prof) for k in range(n)]


def toy_requests(n: int, rate: float, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                         "prompt_tokens": rng.integers(16, 330, n), "output_tokens": rng.integers(1, 120, n)})


@pytest.mark.parametrize("noise", [True, False])
def test_old_and_fleet_loops_agree_and_arrays_are_current(noise: bool, monkeypatch) -> None:
    """On 12 toy instances (three models, some caching, some prompts the
    front end refuses, a step log that fills every 64 steps), both loops
    give the same outcomes and step log; at
    every decision the fleet's ``residents`` equals the live instances'
    counts and every view's, and the views' scalars equal the live ones."""
    import harness.twin.instance as hi
    from harness.twin.simulation import Twin, TwinConfig

    monkeypatch.setattr(hi, "LOG_STEPS", 64)
    reqs = toy_requests(700, 150.0, 1)
    res, seen = {}, {}
    for fleet in (False, True):
        live: list = []
        log: list = []

        def probe(i, t, insts, live=live):
            live.append([(x.residents, x.busy, x.infl_start, x.wake_s, x.n_inbox, x.speed_steps) for x in insts])

        def router(i, t, views, log=log):
            log.append((views.residents.copy(), [v.residents for v in views], views.model_of.copy(),
                        [(v.residents, v.busy, v.infl_start, v.wake_s, v.n_inbox, v.speed_steps) for v in views],
                        [v.arrival_rate for v in views]))
            return int(np.argmin(views.residents + np.arange(len(views)) % 5))

        r = Twin(toy_specs(12, caching=True), TwinConfig(seed=7, noise=noise), fleet_loop=fleet).run(
            reqs, router, on_arrival=probe)
        res[fleet], seen[fleet] = r, (live, log)
    for fleet in (False, True):
        live, log = seen[fleet]
        for now, (arr, per_view, models, scalars, _) in zip(live, log, strict=True):
            assert arr.tolist() == per_view == [x[0] for x in now]
            assert scalars == now
            assert models.tolist() == [0, 1, 2] * 4
    assert digest_frame(res[True].requests) == digest_frame(res[False].requests)
    assert digest_frame(res[True].steps) == digest_frame(res[False].steps)
    assert res[True].steps_run == res[False].steps_run
    assert [x[4] for x in seen[True][1]] == [x[4] for x in seen[False][1]]  # arrival rates, from the shared clock
    assert res[True].extra["rejected"] > 0
    assert res[True].steps_run > 12 * 64 * 3  # several instances filled their log more than once


@pytest.mark.parametrize("noise", [True, False])
def test_residents_only_router_sees_current_counts(noise: bool, monkeypatch) -> None:
    """A router that says it reads only the residents (``reads =
    "residents"``) gets only those refreshed during the run, and the lazy
    fleet loop leaves instances in a steady decode run alone until the run
    ends or they are handed a request: at every decision the counts handed
    are the live instances' (the old loop's, probed), and the outcomes and
    step log are the old loop's, with and without laziness."""
    import harness.twin.instance as hi
    from harness.twin.simulation import Twin, TwinConfig

    monkeypatch.setattr(hi, "LOG_STEPS", 64)
    reqs = toy_requests(1500, 60.0, 2)
    live: list = []
    res, handed = {}, {}
    for name, fleet, lazy in (("old", False, False), ("eager", True, False), ("lazy", True, True)):
        got: list = []

        def router(i, t, views, got=got):
            got.append(views.residents.tolist())
            return int(np.argmin(views.residents + np.arange(len(views)) % 5))

        router.reads = "residents"
        twin = Twin(toy_specs(12), TwinConfig(seed=7, noise=noise), fleet_loop=fleet, lazy=lazy)
        probe = (lambda i, t, insts: live.append([x.residents for x in insts])) if name == "old" else None
        res[name], handed[name] = twin.run(reqs, router, on_arrival=probe), got
    assert handed["old"] == live == handed["eager"] == handed["lazy"]
    for name in ("eager", "lazy"):
        assert digest_frame(res[name].requests) == digest_frame(res["old"].requests)
        assert digest_frame(res[name].steps) == digest_frame(res["old"].steps)
        assert res[name].steps_run == res["old"].steps_run
    assert len({tuple(x) for x in live}) > 50  # the counts moved: a stale array would have failed


@pytest.mark.parametrize("noise", [True, False])
def test_indexed_router_sees_the_eager_views(noise: bool, monkeypatch) -> None:
    """A router that reads views one at a time (``reads = "indexed"``)
    has each view it reads brought to the present when it reads it, and
    the instances it does not read left in their steady runs: every view
    it reads is the eager loop's and the old loop's (the honest scalars,
    the residents and the scheduler arrays), and so are the outcomes and
    the step log."""
    import harness.twin.instance as hi
    from harness.twin.simulation import Twin, TwinConfig

    monkeypatch.setattr(hi, "LOG_STEPS", 64)
    reqs = toy_requests(1500, 60.0, 2)
    res, seen = {}, {}
    for name, fleet, lazy in (("old", False, False), ("eager", True, False), ("lazy", True, True)):
        got: list = []

        def router(i, t, views, got=got):
            pick = [(i * 7) % len(views), (i * 5 + 3) % len(views)]
            for k in pick:
                v = views[k]
                got.append((k, v.h.tobytes(), int(v.res[v.ri]), v.state.sc.tobytes(),
                            v.state.req[:, :4].tobytes(), v.n_inbox, v.infl_n))
            return pick[0] if i % 3 else pick[1]

        router.reads = "indexed"
        twin = Twin(toy_specs(12), TwinConfig(seed=7, noise=noise), fleet_loop=fleet, lazy=lazy)
        res[name], seen[name] = twin.run(reqs, router), got
    assert seen["old"] == seen["eager"] == seen["lazy"]
    for name in ("eager", "lazy"):
        assert digest_frame(res[name].requests) == digest_frame(res["old"].requests)
        assert digest_frame(res[name].steps) == digest_frame(res["old"].steps)
        assert res[name].steps_run == res["old"].steps_run
    assert len({x[1] for x in seen["lazy"]}) > 500  # the views moved: stale ones would have failed


@pytest.mark.parametrize("router", ["sfs-cc", "sfs-hard"])
@pytest.mark.parametrize("ties", ["random", "least-latency"])
def test_lazy_views_change_no_result(router: str, ties: str, monkeypatch) -> None:
    """The latency-aware and chance routers on qwen3-h100-x8 (noise on):
    with random ties (``reads = "indexed"``) the lazy loop (views brought
    to the present as read) serves the same bytes as the eager one (every
    changed view refreshed at every arrival); least-latency reads views
    eagerly."""
    import harness.twin.simulation as sim
    from harness.twin.pools.spec import load_pool
    from harness.twin.replay import ReplayConfig, replay
    from traces.workload.arrivals import ArrivalSpec
    from traces.workload.generator import WorkloadConfig, generate_workload

    pool = load_pool("qwen3-h100-x8")
    wl = generate_workload(WorkloadConfig(requests=1500, arrivals=ArrivalSpec("poisson", 64.0), seed=3))
    cfg = ReplayConfig(router=router, seed=5, ties=ties)
    made: list = []
    monkeypatch.setattr(sim.Twin, "run", lambda self, req, r, *a, _run=sim.Twin.run, **k: (
        made.append(r.reads), _run(self, req, r, *a, **k))[1])
    lazy = replay(pool, "qwen3-h100-x8", wl.requests, wl.quality, cfg)
    assert made[-1] == ("indexed" if ties == "random" else "views")
    monkeypatch.setattr(sim, "LAZY_MIN", 10**9)
    eager = replay(pool, "qwen3-h100-x8", wl.requests, wl.quality, cfg)
    assert digest_frame(lazy.requests) == digest_frame(eager.requests)
    assert lazy.twin.steps_run == eager.twin.steps_run
