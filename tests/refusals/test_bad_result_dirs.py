"""Result directories given to ``check`` and ``report``: every
value they read is checked where it enters, so a corrupted result is refused
in one line naming the file and the key (exit 2), never an internal error,
and ``check`` never passes what it cannot judge (a negative MAPE, an
unfinished sweep, a speed-drift gate on a result without speed factors).

Result directories are written by hand, each case corrupting one thing."""
from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import run_cli
from tests.support.clean_refusal import refused_cleanly

HEADER = {"schema_version": 1, "latroute_version": "test", "command": "latroute test"}
METRICS = {
    "estimate": {"estimators": {"sfs": {"n": 2, "mape": 0.10, "median_ape": 0.05, "p90_ape": 0.2, "p99_ape": 0.4,
                                        "by_load": {"1": {"mape": 0.1}}}},
                 "drift": {}},
    "replay": {"router": "shortest-queue", "ontime_utility": 0.8, "slo_attainment": 0.9, "mean_utility": 0.7,
               "ttft_mean_s": 1.0, "ttft_p90_s": 1.5, "share_by_instance": {"a": 1.0}},
    "sweep": {"cells": 2, "rate_range": [4.0, 8.0],
              "routers": {"shortest-queue": {"router": "shortest-queue", "delta_per_us": 0.0, "lambda": 0.1,
                                             "auc_ontime_utility": 0.8,
                                             "by_rate": {"4": {"ontime_utility": 0.9, "slo_attainment": 0.95},
                                                         "8": {"ontime_utility": 0.7, "slo_attainment": 0.8}}}}},
}
TABLES = {
    "estimate": ("estimates.parquet", {"estimator": ["sfs", "sfs"], "est_s": [0.1, 0.2], "true_s": [0.1, 0.25]}),
    "sweep": ("results.parquet", {"router": ["shortest-queue"] * 2, "rate": [4.0, 8.0], "delta_per_us": [0.0, 0.0],
                                  "lam": [0.1, 0.1], "seed": [0, 0], "ontime_utility": [0.9, 0.7],
                                  "slo_attainment": [0.95, 0.8]}),
}


def write_result(path: Path, kind: str, metrics: dict | None = None, text: str | None = None,
                 table: dict | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    doc = {"kind": kind, **HEADER, **(METRICS[kind] if metrics is None else metrics)}
    (path / "metrics.json").write_text(text if text is not None else json.dumps(doc))
    if kind in TABLES:
        name, cols = TABLES[kind]
        pd.DataFrame(cols if table is None else table).to_parquet(path / name)
    return path


def changed(kind: str, dotted: str, value) -> dict:
    """METRICS[kind] with the key at ``a/b/c`` set to ``value`` (``...``: deleted)."""
    doc = copy.deepcopy(METRICS[kind])
    *keys, last = dotted.split("/")
    d = doc
    for k in keys:
        d = d[k]
    if value is ...:
        del d[last]
    else:
        d[last] = value
    return doc


def baseline(path: Path, kind: str, metrics: dict) -> Path:
    path.write_text(json.dumps({"baseline_version": 1, "kind": kind, "source": "x", "metrics": metrics}))
    return path


BIG = "1" + "0" * 399  # a 400-digit integer: valid JSON, no float holds it


# ------------------------------------------------------------------ check


def test_check_refuses_a_400_digit_integer_in_the_result(tmp_path):
    res = write_result(tmp_path / "r" / "e", "estimate",
                       text=json.dumps({"kind": "estimate", **HEADER, **METRICS["estimate"]})
                       .replace('"mape": 0.1,', f'"mape": {BIG},', 1))
    base = baseline(tmp_path / "b.json", "estimate", {"estimators.sfs.mape": 0.1})
    refused_cleanly(["check", res, "--baseline", base], [tmp_path], "metrics.json", "estimators.sfs.mape",
                    "400 digits")


def test_check_refuses_a_400_digit_integer_in_the_baseline(tmp_path):
    res = write_result(tmp_path / "r" / "e", "estimate")
    base = tmp_path / "b.json"
    base.write_text('{"baseline_version": 1, "kind": "estimate", "metrics": {"estimators.sfs.mape": ' + BIG + "}}")
    refused_cleanly(["check", res, "--baseline", base], [tmp_path], "b.json", "metrics.estimators.sfs.mape",
                    "400 digits")


@pytest.mark.parametrize("where", ["result", "baseline"])
def test_check_refuses_a_negative_mape(tmp_path, where):
    res = write_result(tmp_path / "r" / "e", "estimate",
                       changed("estimate", "estimators/sfs/mape", -0.5) if where == "result" else None)
    base = baseline(tmp_path / "b.json", "estimate", {"estimators.sfs.mape": -0.5 if where == "baseline" else 0.1})
    refused_cleanly(["check", res, "--baseline", base], [tmp_path], "b.json" if where == "baseline"
                    else "metrics.json", "estimators.sfs.mape", "negative")


def test_check_refuses_an_attainment_outside_0_1(tmp_path):
    res = write_result(tmp_path / "r" / "p", "replay", changed("replay", "slo_attainment", 1.5))
    base = baseline(tmp_path / "b.json", "replay", {"slo_attainment": 0.9})
    refused_cleanly(["check", res, "--baseline", base], [tmp_path], "metrics.json", "slo_attainment", "[0, 1]")


def _sweep_pair(tmp_path: Path, **kw) -> tuple[Path, Path]:
    res = write_result(tmp_path / "r" / "s", "sweep", **kw)
    base = baseline(tmp_path / "b.json", "sweep", {"routers.shortest-queue.auc_ontime_utility": 0.8})
    return res, base


def test_check_refuses_a_sweep_still_marked_incomplete(tmp_path):
    res, base = _sweep_pair(tmp_path)
    (res / "INCOMPLETE").write_text("")
    refused_cleanly(["check", res, "--baseline", base], [tmp_path], "INCOMPLETE", "--resume")


def test_check_refuses_a_sweep_with_fewer_rows_than_cells(tmp_path):
    res, base = _sweep_pair(tmp_path, table={k: v[:1] for k, v in TABLES["sweep"][1].items()})
    refused_cleanly(["check", res, "--baseline", base], [tmp_path], "results.parquet", "1 rows", "2 cells")


def test_check_refuses_a_sweep_with_fewer_rows_than_its_specification(tmp_path):
    res, base = _sweep_pair(tmp_path, metrics=changed("sweep", "cells", ...))
    cells = [{"rate": r, "router": "shortest-queue", "delta_per_us": 0.0, "lam": 0.1, "seed": 0} for r in (4, 6, 8)]
    (res / "sweep.json").write_text(json.dumps({"spec_version": 1, "spec": {}, "cells": cells}))
    refused_cleanly(["check", res, "--baseline", base], [tmp_path], "sweep.json", "3 cells", "incomplete")


def test_a_complete_sweep_still_passes_the_gate(tmp_path):
    res, base = _sweep_pair(tmp_path)
    r = run_cli("check", res, "--baseline", base)
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("kind", ["replay", "sweep"])
def test_max_speed_drift_is_refused_on_a_result_without_speed_factors(tmp_path, kind):
    res = write_result(tmp_path / "r" / kind, kind)
    refused_cleanly(["check", res, "--max-speed-drift", "0.1"], [tmp_path], "--max-speed-drift",
                    f"a {kind} result")


def test_max_speed_drift_is_refused_on_an_estimate_that_records_none(tmp_path):
    res = write_result(tmp_path / "r" / "e", "estimate", changed("estimate", "drift", ...))
    refused_cleanly(["check", res, "--max-speed-drift", "0.1"], [tmp_path], "metrics.json", "drift", "missing")


def test_check_refuses_a_metrics_json_that_is_a_fifo_without_waiting(tmp_path):
    res = write_result(tmp_path / "r" / "e", "estimate")
    (res / "metrics.json").unlink()
    os.mkfifo(res / "metrics.json")
    base = baseline(tmp_path / "b.json", "estimate", {"estimators.sfs.mape": 0.1})
    with _deadline(20):
        refused_cleanly(["check", res, "--baseline", base], [tmp_path], "metrics.json", "named pipe")


class _deadline:
    """Fail (not hang) when the body blocks longer than ``seconds``."""

    def __init__(self, seconds: int):
        self.seconds = seconds

    def __enter__(self):
        def expire(signum, frame):
            raise TimeoutError(f"still blocked after {self.seconds} s")

        self.previous = signal.signal(signal.SIGALRM, expire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.previous)


# ------------------------------------------------------------------ report


REPORT_CASES = [
    ("estimate", "estimators", "a string", "estimators"),
    ("estimate", "estimators", [1, 2], "estimators"),
    ("estimate", "estimators", ..., "estimators"),
    ("estimate", "estimators/sfs", "fast", "estimators.sfs"),
    ("estimate", "estimators/sfs/mape", "low", "estimators.sfs.mape"),
    ("estimate", "estimators/sfs/by_load", [0.1], "estimators.sfs.by_load"),
    ("estimate", "estimators/sfs/by_load/1", 0.1, "estimators.sfs.by_load.1"),
    ("estimate", "estimators/sfs/by_cached_share", "0-25%", "estimators.sfs.by_cached_share"),
    ("replay", "ontime_utility", "high", "ontime_utility"),
    ("replay", "ttft_mean_s", ..., "ttft_mean_s"),
    ("replay", "router", 7, "router"),
    ("replay", "share_by_instance", [1.0], "share_by_instance"),
    ("replay", "share_by_instance/a", "all", "share_by_instance.a"),
    ("replay", "serving", {"ttft_ms": {"pxyz": 1.0}}, "serving.ttft_ms.pxyz"),
    ("replay", "serving", {"ttft_ms": [1.0]}, "serving.ttft_ms"),
    ("sweep", "routers", "all", "routers"),
    ("sweep", "routers", ..., "routers"),
    ("sweep", "routers/shortest-queue/router", ..., "routers.shortest-queue.router"),
    ("sweep", "routers/shortest-queue/by_rate/4", 0.9, "routers.shortest-queue.by_rate.4"),
    ("sweep", "routers/shortest-queue/by_rate/fast", {}, "routers.shortest-queue.by_rate.fast"),
    ("sweep", "rate_range", [4.0], "rate_range"),
    ("sweep", "rate_range", ["4", "8"], "rate_range[0]"),
    ("sweep", "frontier", {"router": "x"}, "frontier"),
    ("sweep", "frontier", [{"router": "x", "rate": 4}], "frontier[0]"),
    ("sweep", "router_capabilities", {"x": True}, "router_capabilities.x"),
]


@pytest.mark.parametrize("kind,key,value,column", REPORT_CASES,
                         ids=[f"{k}-{c}-{type(v).__name__}" for k, _, v, c in REPORT_CASES])
def test_report_refuses_a_result_of_the_wrong_shape(tmp_path, kind, key, value, column):
    res = write_result(tmp_path / "r" / kind, kind, changed(kind, key, value))
    refused_cleanly(["report", res, "--out", tmp_path / "rep"], [tmp_path], "metrics.json", column)


def test_report_refuses_a_400_digit_integer_anywhere_in_metrics(tmp_path):
    text = json.dumps({"kind": "replay", **HEADER, **METRICS["replay"], "steps": 1}).replace('"steps": 1', f'"steps": {BIG}')
    res = write_result(tmp_path / "r" / "p", "replay", text=text)
    refused_cleanly(["report", res, "--out", tmp_path / "rep"], [tmp_path], "metrics.json", "steps", "400 digits")


def test_report_refuses_a_lone_surrogate_in_metrics(tmp_path):
    text = json.dumps({"kind": "replay", **HEADER, **METRICS["replay"]}).replace('"shortest-queue"', '"\\ud800"')
    res = write_result(tmp_path / "r" / "p", "replay", text=text)
    refused_cleanly(["report", res, "--out", tmp_path / "rep"], [tmp_path], "metrics.json", "router", "surrogate")


TABLE_CASES = [
    ("sweep", "rate", ["4", "8"], "rate"),
    ("sweep", "rate", [4.0, float("nan")], "rate"),
    ("sweep", "ontime_utility", [0.9, float("inf")], "ontime_utility"),
    ("sweep", "router", [1, 2], "router"),
    ("sweep", "slo_attainment", ..., "slo_attainment"),
    ("sweep", "share_a", ["x", "y"], "share_a"),
    ("estimate", "est_s", ..., "est_s"),
    ("estimate", "true_s", [[0.1], [0.2]], "true_s"),
    ("estimate", "estimator", [None, "sfs"], "estimator"),
]


@pytest.mark.parametrize("kind,column,values,fragment", TABLE_CASES,
                         ids=[f"{k}-{c}-{i}" for i, (k, c, _, _) in enumerate(TABLE_CASES)])
def test_report_refuses_a_table_column_of_the_wrong_type(tmp_path, kind, column, values, fragment):
    name, cols = TABLES[kind]
    cols = dict(cols)
    if values is ...:
        del cols[column]
    else:
        cols[column] = values
    res = write_result(tmp_path / "r" / kind, kind, table=cols)
    refused_cleanly(["report", res, "--out", tmp_path / "rep"], [tmp_path], name, fragment)


def test_report_refuses_an_empty_table(tmp_path):
    res = write_result(tmp_path / "r" / "e", "estimate", table={k: v[:0] for k, v in TABLES["estimate"][1].items()})
    refused_cleanly(["report", res, "--out", tmp_path / "rep"], [tmp_path], "estimates.parquet", "no rows")


def test_report_refuses_a_results_table_that_is_a_fifo_without_waiting(tmp_path):
    res = write_result(tmp_path / "r" / "s", "sweep")
    (res / "results.parquet").unlink()
    os.mkfifo(res / "results.parquet")
    with _deadline(20):
        refused_cleanly(["report", res, "--out", tmp_path / "rep"], [tmp_path], "results.parquet", "named pipe")
