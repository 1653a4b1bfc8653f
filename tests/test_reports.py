"""Reports and the regression gate, from small result fixtures made here."""
from __future__ import annotations

import base64
import json
import re

import pytest

from tests.conftest import assert_refused, run_cli
from traces.store import TraceWriter


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    # a twin trace to estimate on and to validate against
    from harness.pools import load_pool
    from harness.twin import Twin, TwinConfig, shortest_queue_router
    from traces.arrivals import ArrivalSpec
    from traces.workload import WorkloadConfig, generate_workload

    wl = generate_workload(WorkloadConfig(requests=300, arrivals=ArrivalSpec("poisson", 6.0), seed=1))
    r = Twin.from_pool(load_pool("qwen3-h100"), TwinConfig(seed=1)).run(wl.requests, shortest_queue_router)
    with TraceWriter(d / "served") as w:
        w.meta["frontend_overhead_s"] = 0.005
        for name, df in (("requests", r.requests), ("steps", r.steps), ("step_items", r.step_items),
                         ("instances", r.instances)):
            w.write_table(name, df)
    assert run_cli("estimate", d / "served", "--calibrate-on", d / "served", "--out", d / "est").exit_code == 0
    assert run_cli("validate", d / "served", "--profile", "qwen3-8b-h100", "--out", d / "val").exit_code == 0
    for router in ("shortest-queue", "sfs-hard"):
        assert run_cli("replay", "--rate", 6, "--requests", 300, "--router", router, "--out", d / f"rep-{router}").exit_code == 0
    res = run_cli("sweep", "--rates", "5,7", "--requests", 200, "--routers", "shortest-queue,latency-agnostic,sfs-soft",
                  "--deltas", "0,1e-6", "--workers", 1, "--out", d / "sweep")
    assert res.exit_code == 0, res.output
    return d


def _images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', html)]


def test_full_report_renders_every_figure(results, tmp_path):
    args = [results / n for n in ("est", "val", "rep-shortest-queue", "rep-sfs-hard", "sweep")]
    res = run_cli("report", *args, "--out", tmp_path / "rep")
    assert res.exit_code == 0, res.output
    out = tmp_path / "rep"
    html = (out / "index.html").read_text()
    from reports.figures import FIGURES
    names = [n for n, _ in FIGURES]
    for n in names:
        assert (out / n).is_file(), n
        assert n in html and f"]({n})" in (out / "report.md").read_text()
    imgs = _images(html)
    assert len(imgs) == len(names) and all(i.startswith(b"\x89PNG\r\n\x1a\n") for i in imgs)
    assert html.count("<figcaption>") == len(names)
    for title in ("Estimator metrics", "Router metrics", "Parameters"):
        assert title in html
    assert "sfs-hard" in html and "shortest-queue" in html


@pytest.mark.parametrize("which,expect", [
    (("est",), {"estimate_scatter.png", "ape_cdf.png", "mape_by_load.png", "ttft_reliability.png"}),
    (("sweep",), {"ontime_utility_vs_rate.png", "slo_attainment_vs_rate.png", "utility_ttft_frontier.png",
                  "routing_composition.png"}),
])
def test_report_from_partial_inputs(results, tmp_path, which, expect):
    res = run_cli("report", *[results / w for w in which], "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    pngs = {p.name for p in (tmp_path / "r").glob("*.png")}
    assert pngs == expect
    assert len(_images((tmp_path / "r" / "index.html").read_text())) == len(expect)


def test_report_refuses_what_is_not_a_result(tmp_path):
    (tmp_path / "x").mkdir()
    assert_refused(run_cli("report", tmp_path / "x", "--out", tmp_path / "o"), tmp_path / "o", "x", "not a result")


def test_check_passes_identical_and_fails_a_regression(results, tmp_path):
    base = tmp_path / "base.json"
    assert run_cli("check", results / "est", "--baseline", base, "--write-baseline").exit_code == 0
    res = run_cli("check", results / "est", "--baseline", base)
    assert res.exit_code == 0 and "no regression" in res.stdout
    # inject a MAPE regression beyond the default 5% tolerance
    metrics = json.loads((results / "est" / "metrics.json").read_text())
    worse = tmp_path / "worse"
    worse.mkdir()
    (worse / "estimates.parquet").write_bytes((results / "est" / "estimates.parquet").read_bytes())
    metrics["estimators"]["sfs"]["mape"] *= 1.2
    (worse / "metrics.json").write_text(json.dumps(metrics))
    res = run_cli("check", worse, "--baseline", base)
    assert res.exit_code == 1
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("estimators.sfs.mape ")][0]
    assert "REGRESSED" in line
    # a wider tolerance for that metric lets it pass
    assert run_cli("check", worse, "--baseline", base, "--tolerance", "sfs.mape=0.25").exit_code == 0
    # utilities regress when they fall
    sb = tmp_path / "sweep.json"
    assert run_cli("check", results / "sweep", "--baseline", sb, "--write-baseline").exit_code == 0
    doc = json.loads(sb.read_text())
    key = next(k for k in doc["metrics"] if k.endswith("auc_ontime_utility"))
    doc["metrics"][key] *= 1.5
    sb.write_text(json.dumps(doc))
    res = run_cli("check", results / "sweep", "--baseline", sb)
    assert res.exit_code == 1 and key in [ln.split()[0] for ln in res.stdout.splitlines() if "REGRESSED" in ln]


@pytest.mark.parametrize("text,column", [
    ("{not json", "baseline"),
    ('{"baseline_version": 9, "metrics": {"a": 1}}', "baseline_version"),
    ('{"baseline_version": 1, "metrics": {}}', "metrics"),
    ('{"baseline_version": 1, "metrics": {"estimators.sfs.mape": "low"}}', "metrics.estimators.sfs.mape"),
])
def test_check_refuses_a_malformed_baseline(results, tmp_path, text, column):
    base = tmp_path / "b.json"
    base.write_text(text)
    assert_refused(run_cli("check", results / "est", "--baseline", base), None, "b.json", column)


def test_every_result_declares_its_kind_and_check_refuses_another_kind(results, tmp_path):
    kinds = {"est": "estimate", "val": "validate", "rep-sfs-hard": "replay", "sweep": "sweep"}
    for name, kind in kinds.items():
        m = json.loads((results / name / "metrics.json").read_text())
        assert m["kind"] == kind and m["schema_version"] == 1 and m["latroute_version"], name
        assert m["command"].startswith(f"latroute {'replay' if kind == 'replay' else kind} "), m["command"]
    base = tmp_path / "b.json"
    assert run_cli("check", results / "est", "--baseline", base, "--write-baseline").exit_code == 0
    assert_refused(run_cli("check", results / "sweep", "--baseline", base), None, "kind",
                   "estimate baseline cannot check a sweep result")
    m = json.loads((results / "sweep" / "metrics.json").read_text())
    assert m["router_capabilities"]["sfs-soft"]["uses_delta"] and not m["router_capabilities"]["shortest-queue"]["uses_delta"]
