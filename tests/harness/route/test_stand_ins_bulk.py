"""``route --view metrics``: the stand-ins for what a backend's gauges
count beyond the proxy's ledger join its view in one call, at most the
instance's ``max_num_seqs`` of them, however large the gauge; a decision
over such views reads a bounded number of slots."""
from __future__ import annotations

import numpy as np
import pytest

from harness.twin.views.stale import StaleViews


@pytest.fixture()
def views(monkeypatch):
    from harness.route.backends import pool_backends
    from harness.route.inputs import InputPolicies, RequestBook
    from harness.route.ledger import Ledger
    from harness.route.metrics_view import Gauges, MetricsViews
    from harness.serve.clock import Clock
    from harness.twin.pools.spec import load_pool

    bk = pool_backends(load_pool("qwen3-h100"), ("http://x:1", "http://x:2", "http://x:3"))
    book = RequestBook([b.model for b in bk], np.zeros(3), np.zeros(3), InputPolicies(), 64)
    clock = Clock(speed=1.0)
    mv = MetricsViews(bk, Ledger(bk, clock, book.inputs.pred_total), clock, 0.1, 64, book.inputs)
    calls = []
    bulk = StaleViews.dispatched_many
    monkeypatch.setattr(StaleViews, "dispatched_many",
                        lambda self, j, rid, prompt, n: calls.append(n) or bulk(self, j, rid, prompt, n))
    return mv, bk, calls, Gauges, book


def test_100000_running_cost_one_bounded_call(views):
    mv, bk, calls, Gauges, book = views
    seqs = [int(b.spec.config.max_num_seqs) for b in bk]
    for _ in range(20):  # every poll answers 100,000 running and 100,000 waiting
        for j in range(len(bk)):
            mv.publish(j, Gauges(running=100_000.0, waiting=100_000.0, kv=0.5))
    assert len(calls) == 20 * len(bk)  # one call per answer, not one per stand-in
    assert max(calls) <= max(seqs) and calls[:3] == seqs
    for j, v in enumerate(mv.views(0.0)):
        assert v.n_inbox == seqs[j]  # a view holds at most max_num_seqs stand-ins
        assert v.state.capacity <= 2 * max(seqs[j], 64)  # grown once, to what they need
        assert v.inbox.size <= 2 * max(seqs[j], 8)


def test_a_decision_over_stand_ins_reads_bounded_views(views):
    from routers.registry import make_router

    mv, bk, calls, Gauges, book = views
    router = make_router("sfs-cc", book.inputs, [b.spec for b in bk], 0.0, seed=0)
    for j in range(len(bk)):
        mv.publish(j, Gauges(running=1e12 if j else 3.0, waiting=0.0, kv=0.1))
    i = book.take(100, 10, _said())
    v = mv.views(0.0)
    assert sum(x.n_inbox for x in v) <= sum(int(b.spec.config.max_num_seqs) for b in bk)
    assert router(i, v[0].t, v) == 0  # the nearly empty backend, over the two the gauges fill
    mv.sent(0, i, 100)
    assert calls[-1] == 1 and mv.views(0.0)[0].n_inbox == 4  # a sent request: one arrival


def _said():
    from harness.route.inputs import stated

    return stated({}, {})
