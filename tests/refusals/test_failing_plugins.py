"""Plug-ins are foreign code: a router or estimator plug-in that
cannot be imported, has the wrong type, raises, or answers something that
is not an answer is refused as ``error: plug-in 'mod:Class' ...`` (naming
the request where there is one), exit 2, and nothing is written; and
``replay --router a,b`` is refused naming the option."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from routers.registry import make_router
from tests.harness.twin.views.test_views_hide_the_truth import PROFILE, specs
from tests.support.clean_refusal import refused_cleanly
from traces.errors import BadInput as PluginError  # estimators.plugins.PluginError is one (main has neither)

P = "tests.plugin_router:"


def replay_args(router: str, out) -> list:
    return ["replay", "--rate", 20, "--requests", 12, "--router", router, "--out", out]


@pytest.mark.parametrize("plugin,fragments", [
    ("RaisesInChoose", ("choose() raised ZeroDivisionError", "at request 0")),
    ("AnswersNone", ("choose() returned None", "at request 0")),
    ("RaisesInInit", ("__init__ raised RuntimeError: no config file",)),
    ("NOT_A_ROUTER", ("is a int, neither a RouterEntry",)),
])
def test_replay_refuses_a_failing_router_plugin_and_writes_nothing(tmp_path, plugin, fragments):
    out = tmp_path / "r"
    refused_cleanly(replay_args(P + plugin, out), [tmp_path], f"plug-in '{P}{plugin}'", *fragments)
    assert not out.exists()


def test_replay_refuses_a_plugin_that_cannot_be_imported(tmp_path, monkeypatch):
    (tmp_path / "broken_at_import.py").write_text("raise RuntimeError('half-installed')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "r"
    refused_cleanly(replay_args("broken_at_import:X", out), [tmp_path], "plug-in 'broken_at_import:X'",
                    "cannot be loaded", "RuntimeError: half-installed")
    refused_cleanly(replay_args("no_such_module_hostile:X", out), [tmp_path], "plug-in 'no_such_module_hostile:X'",
                    "cannot be loaded", "ModuleNotFoundError")
    assert not out.exists()


def test_replay_refuses_a_router_list(tmp_path):
    out = tmp_path / "r"
    refused_cleanly(replay_args("shortest-queue,round-robin", out), [tmp_path], "--router", "takes one router",
                    "latroute sweep --routers shortest-queue,round-robin")
    assert not out.exists()


@pytest.mark.parametrize("plugin,answer", [
    ("AnswersOutOfRange", "returned instance 99, not in 0..1"), ("AnswersNegative", "returned instance -1"),
    ("AnswersNaN", "returned nan (float)"), ("AnswersFloat", "returned 1.0 (float)"),
    ("AnswersBool", "returned True (bool)"), ("AnswersString", "returned '1' (str)"),
])
def test_a_router_plugin_answer_that_is_not_an_index_is_refused_with_its_request(plugin, answer):
    from harness.twin.simulation import Twin, TwinConfig
    from routers.base import RouteInputs

    reqs = pd.DataFrame({"request_id": [70, 71], "arrival_s": [0.0, 0.1], "prompt_tokens": [20, 20],
                         "output_tokens": [3, 3]})
    sp = specs(2)
    inputs = RouteInputs(np.array([20, 20]), np.ones(2), np.zeros((2, 2)), np.array([3, 3]))
    with pytest.raises(PluginError) as e:
        Twin(sp, TwinConfig(record_steps=False)).run(reqs, make_router(P + plugin, inputs, sp, 0.0))
    assert str(e.value).startswith(f"plug-in '{P}{plugin}' at request 70: choose() {answer}"), str(e.value)


def test_probe_router_builds_a_plugin_without_running_it():
    from routers.registry import probe_router

    sp = specs(2)
    probe_router(P + "LastInstance", sp)  # builds: nothing to refuse
    probe_router("sfs-hard", sp)  # built-ins: the name is checked, nothing built
    with pytest.raises(PluginError, match="__init__ raised RuntimeError"):
        probe_router(P + "RaisesInInit", sp)
    with pytest.raises(PluginError, match="neither a RouterEntry"):
        probe_router(P + "NOT_A_ROUTER", sp)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from harness.twin.simulation import Twin, TwinConfig, write_twin_trace
    from tests.harness.twin.views.test_views_hide_the_truth import workload
    from traces.store import TraceWriter

    reqs = workload(10, 40.0, 2).assign(output_tokens=5)
    res = Twin(specs(1), TwinConfig(seed=2)).run(reqs, lambda i, t, insts: 0)
    path = tmp_path_factory.mktemp("served") / "t"
    with TraceWriter(path) as w:
        write_twin_trace(w, res)
    return path


@pytest.mark.parametrize("plugin,fragments", [
    ("EstimatorRaises", ("at request 500", "estimate() raised KeyError")),
    ("EstimatorNaN", ("at request 500", "estimate() returned nan", "finite and >= 0")),
    ("EstimatorNegative", ("at request 500", "estimate() returned -0.5")),
    ("EstimatorInfinite", ("at request 500", "estimate() returned inf")),
    ("EstimatorArray", ("at request 500", "(ndarray), not a number of seconds")),
    ("EstimatorRaisesInInit", ("__init__ raised ValueError: needs a GPU",)),
])
def test_estimate_refuses_a_failing_estimator_plugin(served, plugin, fragments):
    from estimators.estimate import EstimateConfig, estimate_trace
    from traces.store import open_trace

    with pytest.raises(PluginError) as e:
        estimate_trace(open_trace(served), {"i0": (PROFILE, None)},
                       EstimateConfig(estimators=(P + plugin,), lengths="median"))
    assert str(e.value).startswith(f"plug-in '{P}{plugin}'"), str(e.value)
    for frag in fragments:
        assert frag in str(e.value), (frag, str(e.value))


def test_estimate_cli_refuses_a_failing_estimator_plugin_and_writes_nothing(served, tmp_path):
    out = tmp_path / "e"
    refused_cleanly(["estimate", served, "--calibrate-on", served, "--estimators", P + "EstimatorNaN", "--lengths",
                     "median", "--out", out], [tmp_path, served], f"plug-in '{P}EstimatorNaN' at request 500",
                    "returned nan")
    assert not out.exists()
