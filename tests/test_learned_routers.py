"""Routers over the learned estimator: ``learned-hard``,
``learned-cc`` and ``llmd-headroom`` -- their registry entries, the
first-token feed's causality, determinism of a replay, the fleet pools."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("lightgbm")

from estimators.estimate import BaselineParams  # noqa: E402
from harness.twin.pools.spec import load_pool  # noqa: E402
from harness.twin.replay import ReplayConfig, workload_inputs  # noqa: E402
from harness.twin.simulation import Twin, TwinConfig  # noqa: E402
from routers.learned import FirstTokenFeed  # noqa: E402
from routers.registry import REGISTRY, make_router  # noqa: E402
from traces.workload.arrivals import ArrivalSpec  # noqa: E402
from traces.workload.generator import WorkloadConfig, generate_workload  # noqa: E402

LEARNED_ROUTERS = ("learned-hard", "learned-cc", "llmd-headroom")


def test_registry_entries_declare_what_they_need():
    for name in LEARNED_ROUTERS:
        e = REGISTRY[name]
        assert e.estimator == "learned" and e.needs_baselines and e.uses_lambda and not e.oracle
        assert not e.uses_delta and not e.main
    assert REGISTRY["learned-cc"].uses_epsilon and REGISTRY["llmd-headroom"].seeded


class _Est:
    def __init__(self):
        self.seen = []

    def observe(self, rid, first, ttft):
        self.seen.append((rid, first, ttft))

    def record(self, view, q):
        pass


def test_feed_passes_on_only_first_tokens_strictly_before_now():
    feed = FirstTokenFeed(overhead_s=0.01)
    est = _Est()
    first = np.full(5, np.nan)
    feed.first_t = first
    for rid, t in enumerate((0.0, 0.1, 0.2, 0.3, 0.4)):
        feed.placed(est, object(), rid, t, 10)
    first[:4] = (0.5, 0.6, 0.7, 0.9)  # request 4: not out yet
    feed.deliver(0.7)  # 0.7 itself is not strictly before
    assert est.seen == [(0, 0.5, pytest.approx(0.51)), (1, 0.6, pytest.approx(0.51))]
    first[2:4] = (50.0, 60.0)  # a later first token changes nothing already passed on
    feed.deliver(0.8)
    assert len(est.seen) == 2 and set(feed.pending) == {2, 3, 4}


def _run(pool_ref, rate, n, router, seed=0):
    """One twin replay of ``router`` (hand-made baseline parameters for its
    cold start: the pool's calibration replay is not what is tested here)."""
    pool = load_pool(pool_ref)
    wl = generate_workload(WorkloadConfig(requests=n, arrivals=ArrivalSpec("poisson", rate), seed=0))
    twin = Twin.from_pool(pool, TwinConfig(seed=seed, record_steps=False))
    w = workload_inputs(wl.requests, wl.quality, twin.specs, ReplayConfig(router=router, seed=seed))
    base = {s.instance_id: BaselineParams(2e4, 0.01, 8, 1.0, 1.0, 1.0, 0.01, 0.01, 0.0, 0.3) for s in twin.specs}
    r = make_router(router, w.route, twin.specs, pool.frontend_overhead_s, seed=seed, baselines=base,
                    true_outputs=wl.requests["output_tokens"].to_numpy())
    res = twin.run(wl.requests, r, predicted=w.lengths.tokens)
    return r, res.requests


def test_learned_cc_replay_is_deterministic_learns_and_sees_no_truth():
    r, a = _run("qwen3-h100", 8.0, 400, "learned-cc")
    _, b = _run("qwen3-h100", 8.0, 400, "learned-cc")
    assert a.to_json() == b.to_json()
    assert r.feed.first_t is not None and not r.feed.first_t.flags.writeable
    assert sum(e.trainer.fits for e in r.estimators) > 0  # it learned from the twin's feed
    assert {e.last_source for e in r.estimators} == {"learned"}
    assert not hasattr(r, "outputs")  # no true lengths reached it (only oracle entries get them)
    assert a["ttft_s"].notna().all()


@pytest.mark.parametrize("router", LEARNED_ROUTERS)
def test_on_a_replica_pool_seeded(router):
    r, a = _run("qwen3-h100-x8", 48.0, 300, router, seed=1)
    _, b = _run("qwen3-h100-x8", 48.0, 300, router, seed=1)
    assert a.to_json() == b.to_json()
    assert len({id(e.trainer) for e in r.estimators}) == 3  # one model per model of the pool, shared by replicas
    assert a["instance_id"].nunique() > 3  # replicas used, not only replica 0
    # (random ties, the default) the feed needs every instance's first tokens: no instance is left behind lazily
    assert r.reads == "views"


def test_learned_routers_without_lightgbm_are_refused_before_any_work(tmp_path, monkeypatch):
    import harness.cli.replay_options as ro
    from tests.conftest import run_cli

    monkeypatch.setattr(ro, "learned_available", lambda: False)
    for args in (["replay", "--router", "learned-cc"], ["sweep", "--routers", "sfs-cc,llmd-headroom", "--rates", "4"]):
        r = run_cli(*args, "--requests", "20", "--out", tmp_path / args[0])
        assert r.exit_code == 2 and "needs LightGBM" in r.output, r.output
        assert not (tmp_path / args[0]).exists()


def test_the_training_schedule_is_an_option_of_replay_and_sweep(tmp_path):
    """--retrain-every / --window reach the learned routers' trainers and are
    recorded; a sweep spec takes them as keys (retrain_every, window)."""
    import json

    from tests.conftest import run_cli

    r = run_cli("replay", "--router", "learned-hard", "--rate", "4", "--requests", "300", "--retrain-every", "20", "--window", "50",
                "--out", tmp_path / "r")
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["learned"]["retrain_every_s"] == 20.0 and m["learned"]["window"] == 50
    spec = tmp_path / "spec.toml"
    spec.write_text('rates = [4]\nrouters = ["learned-hard"]\nrequests = 300\nretrain_every = 20\nwindow = 50\n')
    r = run_cli("sweep", "--spec", spec, "--out", tmp_path / "s")
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "s" / "metrics.json").read_text())
    assert s["retrain_every_s"] == 20.0 and s["window"] == 50, sorted(s)
