"""Stale views: state published at an interval, with or without the ledger."""
import pandas as pd

from harness.twin.pools.spec import load_pool
from harness.twin.replay import ReplayConfig, replay
from traces.workload.arrivals import ArrivalSpec
from traces.workload.generator import WorkloadConfig, generate_workload


def _run(router, interval, ledger=True, n=400, seed=4):
    wl = generate_workload(WorkloadConfig(requests=n, arrivals=ArrivalSpec("poisson", 9.0), seed=seed)).requests
    return replay(load_pool("qwen3-h100"), "qwen3-h100", wl, None,
                  ReplayConfig(router=router, seed=1, view_interval_ms=interval, ledger=ledger))


def test_publication_does_not_change_the_engines():
    """Advancing instances to publication boundaries first must not change
    the twin: a router that ignores state routes identically."""
    live, stale = _run("round-robin", 0.0), _run("round-robin", 100.0)
    pd.testing.assert_frame_equal(live.requests, stale.requests)
    assert stale.metrics["view_refreshes"] > 0 and live.metrics["view_refreshes"] is None


def test_stale_views_change_decisions_and_are_deterministic():
    live = _run("sfs-hard", 0.0)
    a, b = _run("sfs-hard", 1000.0), _run("sfs-hard", 1000.0)
    pd.testing.assert_frame_equal(a.requests, b.requests)  # same seed, same results
    assert (a.requests["instance_id"] != live.requests["instance_id"]).any()
    off = _run("sfs-hard", 1000.0, ledger=False)
    assert (off.requests["instance_id"] != a.requests["instance_id"]).any()  # the ledger changes what it sees
    # without the ledger, every request between publications sees the same view: herding to one instance
    share = off.requests.groupby("instance_id").size().max() / len(off.requests)
    assert share >= a.requests.groupby("instance_id").size().max() / len(a.requests)
