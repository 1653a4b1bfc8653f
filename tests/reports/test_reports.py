"""Reports and the regression gate, from small result fixtures made here."""
from __future__ import annotations

import base64
import json
import re

import pytest

from tests.conftest import assert_refused, run_cli, served_twin_trace


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("results")
    # a twin trace to estimate on and to validate against
    served_twin_trace(d / "served")
    assert run_cli("estimate", d / "served", "--calibrate-on", d / "served", "--out", d / "est").exit_code == 0
    assert run_cli("validate", d / "served", "--profile", "qwen3-8b-h100", "--out", d / "val").exit_code == 0
    for router in ("shortest-queue", "sfs-hard"):
        assert run_cli("replay", "--rate", 6, "--requests", 300, "--router", router, "--out", d / f"rep-{router}").exit_code == 0
    res = run_cli("sweep", "--rates", "5,7", "--requests", 200, "--routers", "shortest-queue,latency-agnostic,sfs-soft",
                  "--deltas", "0,1e-6", "--workers", 1, "--out", d / "sweep")
    assert res.exit_code == 0, res.output
    res = run_cli("sweep", "--rates", "7", "--requests", 100, "--routers", "sfs-soft", "--deltas", "0,1e-6,1e-5",
                  "--workers", 1, "--out", d / "frontier")
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
    names = ["estimate_scatter.png", "ape_cdf.png", "mape_by_load.png", "ontime_utility_vs_rate.png",
             "slo_attainment_vs_rate.png", "utility_ttft_frontier.png", "routing_composition.png", "ttft_cdf.png",
             "ttft_reliability.png"]
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
    assert run_cli("check", worse, "--baseline", base, "--tolerance", "estimators.sfs.mape=0.25").exit_code == 0
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


# -- the figures' content (each test failed on the old figures) --

def _specs(results, *names):
    from reports.results import load_result
    from reports.series import assign_labels, figure_specs

    loaded = [load_result(results / n) for n in names]
    assign_labels(loaded)
    return {s.name: s for s in figure_specs(loaded)}, loaded


def test_soft_router_legend_shows_each_delta_cells_own_auc(results):
    specs, (sweep,) = _specs(results, "sweep")
    soft = [s for s in specs["ontime_utility_vs_rate"].panels[0].series if s.group == "sfs-soft"]
    assert len(soft) == 2  # one line per delta, not only the smallest delta
    for v in sweep.metrics["routers"].values():
        if v["router"] == "sfs-soft":
            label = f"sfs-soft δ={v['delta_per_us']:g} (AUC {v['auc_ontime_utility']:.3f})"
            assert label in [s.label for s in soft], (label, [s.label for s in soft])


def test_results_with_the_same_folder_name_are_told_apart(results, tmp_path):
    import shutil

    for parent in ("a", "b"):
        shutil.copytree(results / "sweep", tmp_path / parent / "sweep")
    res = run_cli("report", tmp_path / "a" / "sweep", tmp_path / "b" / "sweep", "--out", tmp_path / "rep")
    assert res.exit_code == 0, res.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "a/sweep" in md and "b/sweep" in md
    from reports.results import load_result
    from reports.series import assign_labels, figure_specs

    loaded = [load_result(tmp_path / p / "sweep") for p in ("a", "b")]
    assign_labels(loaded)
    comp = {s.name: s for s in figure_specs(loaded)}["routing_composition"]
    rows = comp.panels[0].series[0].y
    assert len(rows) == len(set(rows)) == 8
    titles = [p.title for p in {s.name: s for s in figure_specs(loaded)}["ontime_utility_vs_rate"].panels]
    assert len(set(titles)) == 2


def test_one_colour_per_router_across_every_figure(results):
    specs, _ = _specs(results, "sweep", "frontier", "rep-shortest-queue", "rep-sfs-hard")
    colour_of: dict[str, set] = {}
    for spec in specs.values():
        if spec.name == "routing_composition":
            continue  # coloured by instance
        for p in spec.panels:
            for s in p.series:
                colour_of.setdefault(s.group, set()).add(s.color)
    assert {"shortest-queue", "sfs-soft", "sfs-hard"} <= set(colour_of)
    assert all(len(c) == 1 for c in colour_of.values()), colour_of
    assert len({next(iter(c)) for c in colour_of.values()}) == len(colour_of)  # distinct routers, distinct colours


def test_error_figures_use_log_axes_without_a_symlog_knee(results):
    specs, _ = _specs(results, "est")
    assert specs["mape_by_load"].panels[0].ylog  # lps-mg's thousands of % no longer flatten the rest
    ape = specs["ape_cdf"].panels[0]
    from reports.series import APE_FLOOR

    assert ape.xlog and all(x >= APE_FLOOR for s in ape.series for x in s.x)


def test_captions_state_what_the_data_shows(results):
    import pandas as pd

    specs, _ = _specs(results, "sweep")
    cap = specs["ontime_utility_vs_rate"].caption
    assert "the gap widens as load grows" not in cap
    df = pd.read_parquet(results / "sweep" / "results.parquet")
    top = df[df["rate"] == df["rate"].max()].groupby(["router", "delta_per_us"])["ontime_utility"].mean()
    (router, delta) = top.idxmax()
    assert f"best {router}" in cap
    gap = {rate: g.groupby(["router", "delta_per_us"])["ontime_utility"].mean() for rate, g in df.groupby("rate")}
    lo, hi = (gap[r].max() - gap[r].min() for r in sorted(gap))
    assert ("widens" if hi > lo * 1.05 else "narrows" if hi < lo * 0.95 else "stays about the same") in cap


def test_ttft_cdf_marks_the_slo(results):
    import numpy as np
    import pandas as pd

    specs, _ = _specs(results, "rep-shortest-queue", "rep-sfs-hard")
    p = specs["ttft_cdf"].panels[0]
    slo = pd.concat(pd.read_parquet(results / f"rep-{r}" / "served" / "requests.parquet")["slo_ttft_s"]
                    for r in ("shortest-queue", "sfs-hard"))
    assert p.vlines and np.isclose(p.vlines[0][0], slo.median())
    assert "Met: shortest-queue" in specs["ttft_cdf"].caption


def test_interactive_ttft_cdf_labels_sit_on_their_slo_lines(tmp_path):
    """On the TTFT CDF's log x axis each dashed SLO line's label is at the
    line: Plotly reads an annotation's x there as log10 of the value (a shape's
    as the value), so a label given the line's x sat at 10**x (1.5 s for a
    0.18 s line)."""
    import math

    assert run_cli("replay", "--rate", 6, "--requests", 200, "--router", "sfs-hard", "--out",
                   tmp_path / "rep").exit_code == 0
    res = run_cli("report", tmp_path / "rep", "--out", tmp_path / "report")
    assert res.exit_code == 0, res.output
    page = (tmp_path / "report" / "interactive.html").read_text()
    key = 'Plotly.newPlot("fig-ttft_cdf", f.data, f.layout, {responsive: true, displaylogo: false});})('
    fig, _ = json.JSONDecoder().raw_decode(page, page.index(key) + len(key))
    layout = fig["layout"]
    assert layout["xaxis"]["type"] == "log"
    lines = [s for s in layout["shapes"] if s["x0"] == s["x1"]]
    labels = [a for a in layout["annotations"] if "SLO" in a["text"]]
    assert [a["text"].split()[0] for a in labels] == ["median", "p90"] and len(lines) == 2
    for line, label in zip(lines, labels):
        assert label["xref"] == line["xref"] == "x"
        assert label["x"] == pytest.approx(math.log10(line["x0"])), (label, line)
        assert label["text"] == f"{label['text'].split()[0]} SLO {line['x0']:.3g} s"


def test_frontier_labels_do_not_overlap():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from reports.figures import LABEL_MIN_SEP, _axes_fraction, place_labels

    fig, ax = plt.subplots()
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    pts = [(0.5, 0.5, "a"), (0.51, 0.505, "b"), (0.9, 0.1, "c"), (0.905, 0.1, "d")]
    texts = place_labels(ax, pts)
    assert [t.get_text() for t in texts] == ["a", "c"]
    pos = [_axes_fraction(ax, *t.xy) for t in texts]
    assert all(np.hypot(*(p - q)) >= LABEL_MIN_SEP for i, p in enumerate(pos) for q in pos[i + 1:])
    plt.close(fig)


def test_scatter_panels_name_their_mape_and_share_axes(results, tmp_path):
    specs, _ = _specs(results, "est")
    spec = specs["estimate_scatter"]
    for p in spec.panels:
        assert "MAPE" in p.title and p.equal and p.diagonal
    import matplotlib

    matplotlib.use("Agg")
    from reports import figures

    captured = []
    orig = figures._draw_panel
    figures._draw_panel = lambda ax, p: (orig(ax, p), captured.append((ax.get_xlim(), ax.get_ylim())))
    try:
        figures.draw_png(spec, tmp_path / "s.png")
    finally:
        figures._draw_panel = orig
    assert captured and all(x == y for x, y in captured)


def test_frontier_sweep_rows_in_router_metrics_are_filled(results):
    from reports.render import router_table
    from reports.results import load_result

    head, rows = router_table([load_result(results / "frontier")])
    assert len(rows) == 3
    for row in rows:
        assert "-" not in (row[2], row[4], row[5], row[6]), row


def _headless_chromium(tmp_path):
    """Chromium + chromedriver from the OS packages, driven by selenium;
    skips cleanly when any of them is absent."""
    import shutil

    webdriver = pytest.importorskip("selenium.webdriver")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_bin = shutil.which("chromedriver")
    if not browser or not driver_bin:
        pytest.skip("chromium and chromedriver not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1400,1000"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_bin), options=opts)


def render_in_browser(page, tmp_path, screenshot):
    """Open ``page`` in headless Chromium; return (console errors, ids of
    figures whose plot rendered, ids of all figures) and save a screenshot."""
    import time

    driver = _headless_chromium(tmp_path)
    try:
        driver.get(page.resolve().as_uri())
        ids = driver.execute_script("return [...document.querySelectorAll('.plotly-figure')].map(d => d.id)")
        deadline = time.time() + 60
        rendered = []
        while time.time() < deadline:
            rendered = driver.execute_script(
                "return [...document.querySelectorAll('.plotly-figure')]"
                ".filter(d => d.querySelector('.main-svg') && d._fullLayout).map(d => d.id)")
            if len(rendered) == len(ids):
                break
            time.sleep(0.2)
        errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1400, min(int(height) + 100, 12000))  # the whole page in one screenshot
        driver.save_screenshot(str(screenshot))
        return errors, rendered, ids
    finally:
        driver.quit()


def test_interactive_report_renders_in_headless_chromium(results, tmp_path):
    args = [results / n for n in ("est", "val", "rep-shortest-queue", "rep-sfs-hard", "sweep", "frontier")]
    res = run_cli("report", *args, "--out", tmp_path / "rep")
    assert res.exit_code == 0, res.output
    page = tmp_path / "rep" / "interactive.html"
    assert page.is_file() and "<script src=" not in page.read_text()  # self-contained: plotly.js inlined
    errors, rendered, ids = render_in_browser(page, tmp_path, tmp_path / "shot.png")
    assert not errors, errors
    assert len(ids) == 9 and sorted(rendered) == sorted(ids), (rendered, ids)  # 8 + the reliability diagram
    assert (tmp_path / "shot.png").read_bytes().startswith(b"\x89PNG")


def test_every_result_has_a_tidy_metrics_table(results):
    import pandas as pd

    for name in ("est", "val", "rep-shortest-queue", "sweep", "frontier"):
        assert (results / name / "metrics.json").is_file()
        long = pd.read_parquet(results / name / "metrics.parquet")
        assert len(long) > 0 and {"metric", "value"} <= set(long.columns), name
    assert set(pd.read_parquet(results / "val" / "metrics.parquet")["source"]) == {"recorded", "twin"}
    est = pd.read_parquet(results / "est" / "metrics.parquet")
    m = json.loads((results / "est" / "metrics.json").read_text())["estimators"]
    assert est[(est.estimator == "sfs") & (est.load == "all") & (est.metric == "mape")]["value"].item() == \
        pytest.approx(m["sfs"]["mape"])
