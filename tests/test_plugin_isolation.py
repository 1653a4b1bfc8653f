"""Plug-ins in a process of their own (``--isolate-plugins``, ``estimators.plugin_process``).

In latroute's process a plug-in can walk the caller's frames, what refers to its views and every
object the collector tracks (``gc.get_objects``), and there it finds every true output length (the first test: the walk is not blind). Isolated, the
same walk finds none, it decides as it would in-process, and its failures -- an exception, a hang
past the per-call limit, its process ending -- are plug-in errors naming it and the request.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from estimators.plugins import PluginError
from harness.twin.replay import ReplayConfig, workload_inputs
from harness.twin.simulation import Twin, TwinConfig
from routers.registry import make_router
from tests.test_hostile_views_truth import PROFILE, specs, truths, workload

WALKER = "tests.plugin_router:ProcessWalker"


def run(path: str, n: int, isolate_s: float | None, seed: int = 3, instances: int = 2):
    reqs = workload(n, 40.0, seed)
    sp = specs(instances)
    inputs = workload_inputs(reqs, None, sp, ReplayConfig(lengths="median", slo="rule", quality="model")).route
    isolated = {} if isolate_s is None else {"isolate_s": isolate_s}
    router = make_router(path, inputs, sp, 0.0, true_outputs=reqs["output_tokens"].to_numpy(), **isolated)
    try:
        res = Twin(sp, TwinConfig(seed=seed)).run(reqs, router, predicted=inputs.pred_total)
    finally:
        if isolate_s is not None:
            router.close()
    return reqs, inputs, router, res


def walked(tmp_path, monkeypatch, isolate_s):
    out = tmp_path / f"walk-{isolate_s}.txt"
    monkeypatch.setenv("LATROUTE_TEST_WALK_OUT", str(out))  # the child inherits the environment
    reqs, inputs, router, res = run(WALKER, 8, isolate_s)
    secret = truths(reqs, inputs.pred_total)
    lines = out.read_text().splitlines()
    return router, res, [np.intersect1d(secret, np.array(line.split(), dtype=np.int64)).size for line in lines]


def test_in_process_a_plugin_reaches_the_true_lengths_through_frames_and_referrers(tmp_path, monkeypatch):
    router, _, found = walked(tmp_path, monkeypatch, None)
    assert type(router).__name__ != "IsolatedRouter"  # the plug-in itself, in this process
    assert len(found) == 8 and min(found) > 0  # every decision reached true lengths: the walk can fail the test


def test_isolated_the_same_walk_finds_no_true_length(tmp_path, monkeypatch):
    router, res, found = walked(tmp_path, monkeypatch, 20.0)
    from routers.foreign import IsolatedRouter

    assert isinstance(router, IsolatedRouter) and router.decisions == 8
    assert found == [0] * 8
    assert res.requests["finish_reason"].eq("length").all()  # the sentinels were real lengths, never reached


def test_isolated_decisions_are_the_in_process_ones():
    a = run("tests.plugin_router:Walker", 12, None, seed=5, instances=3)[3].requests
    b = run("tests.plugin_router:Walker", 12, 20.0, seed=5, instances=3)[3].requests
    assert a["instance_id"].tolist() == b["instance_id"].tolist()
    assert np.array_equal(a["ttft_s"].to_numpy(), b["ttft_s"].to_numpy())


@pytest.mark.parametrize("path, timeout, says", [
    ("tests.plugin_router:RaisesInChoose", 20.0, "ZeroDivisionError"),
    ("tests.plugin_router:SleepsInChoose", 0.5, "did not answer within 0.5 s"),
    ("tests.plugin_router:ExitsInChoose", 20.0, "its process died during __call__ (exit code 3)"),
    ("tests.plugin_router:RaisesInInit", 20.0, "no config file for this router"),
])
def test_an_isolated_plugin_that_fails_is_a_plugin_error(path, timeout, says):
    with pytest.raises(PluginError) as e:
        run(path, 4, timeout)
    assert path in str(e.value) and says in str(e.value)


def test_an_oracle_plugin_cannot_be_isolated():
    with pytest.raises(PluginError, match="oracle"):
        run("tests.plugin_router:OracleWalker", 4, 20.0)


def test_an_isolated_estimator_gives_the_in_process_estimates(tmp_path):
    from estimators.estimate import EstimateConfig, estimate_trace
    from harness.twin.simulation import write_twin_trace
    from traces.store import TraceWriter, open_trace

    reqs = workload(16, 40.0, 7)
    res = Twin(specs(2), TwinConfig(seed=7)).run(reqs, lambda i, t, insts: i % 2)
    with TraceWriter(tmp_path / "t") as w:
        write_twin_trace(w, res)
    trace = open_trace(tmp_path / "t")
    models = {"i0": (PROFILE, None), "i1": (PROFILE, None)}
    est = [estimate_trace(trace, models, EstimateConfig(estimators=("tests.plugin_router:PromptTimesMs",),
                                                        lengths="median", plugin_timeout_s=s)).estimates
           for s in (None, 20.0)]
    assert len(est[0]) == 16
    assert np.array_equal(est[0]["est_s"].to_numpy(), est[1]["est_s"].to_numpy())


def test_the_cli_default_and_bound_mirror_the_process_host():
    from estimators.plugin_process import DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S
    from harness.cli.plugin_options import DEFAULT_PLUGIN_TIMEOUT_S, MAX_PLUGIN_TIMEOUT_S

    assert (DEFAULT_PLUGIN_TIMEOUT_S, MAX_PLUGIN_TIMEOUT_S) == (DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S)


def latroute(*args, cwd):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300)


def test_plugin_timeout_without_isolation_is_refused(tmp_path):
    r = latroute("replay", "--rate", "8", "--requests", "20", "--router", "tests.plugin_router:LastInstance",
                 "--plugin-timeout", "5", "--out", str(tmp_path / "r"), cwd=tmp_path.parent)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--plugin-timeout" in r.stderr
    assert not (tmp_path / "r").exists()


def test_replay_with_isolated_plugins_says_so(tmp_path):
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    r = latroute("replay", "--rate", "8", "--requests", "30", "--router", "tests.plugin_router:LastInstance",
                 "--isolate-plugins", "--out", str(tmp_path / "r"), cwd=root)
    assert r.returncode == 0, r.stderr
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["router_isolated"] is True and m["mean_decision_us"] > 0
