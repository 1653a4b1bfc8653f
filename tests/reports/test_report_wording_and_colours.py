"""What the reports and summaries say, checked against what the docs promise:
the warm-cache median, the request-level coverage line, the sweep summary's
header, the demo's first speed, "a estimate", and the report's colours,
scatter strip, serving table and parameter table; and the reports layer's
own rules (no model, router or harness import; no module over 400 lines)."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.conftest import assert_refused, run_cli, served_twin_trace, shared
from traces.store import TraceWriter, open_trace

ROOT = Path(__file__).resolve().parents[2]
DEMO_ROUTERS = "shortest-queue,latency-agnostic,sfs-hard,sfs-soft,sfs-cc,sfs-eu"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """An estimate of every estimator, a sweep of the demo's six routers
    (the four SFS routers among them) and a replay."""
    d = tmp_path_factory.mktemp("house")
    served_twin_trace(d / "served")
    assert run_cli("estimate", d / "served", "--calibrate-on", d / "served", "--out", d / "est").exit_code == 0
    assert run_cli("replay", "--rate", 6, "--requests", 200, "--router", "sfs-hard", "--out", d / "rep").exit_code == 0
    res = run_cli("sweep", "--rates", "5,7", "--requests", 100, "--routers", DEMO_ROUTERS, "--deltas", "1e-6",
                  "--workers", 1, "--out", d / "sweep")
    assert res.exit_code == 0, res.output
    (d / "sweep.out").write_text(res.stdout)
    res = run_cli("report", d / "est", d / "rep", d / "sweep", "--out", d / "report")
    assert res.exit_code == 0, res.output
    return d


# -- 1. the warm-cache median, 2. the request-level coverage line -----------------

@pytest.fixture(scope="module")
def request_level(tmp_path_factory):
    """The first 60 requests of the 16 q/s Llama-3.3-70B A100 run and a quick
    request-level profile of them."""
    run = "serving_meta-llama-Llama-3.3-70B-Instruct_tp8_pp1_sharegpt_qps_16__01_tp8_pp1.json"
    src = shared("vllm_bench_serving_a100_per_request", "runs", run)
    d = tmp_path_factory.mktemp("rl")
    assert run_cli("trace", "import", "vllm-bench", src, "--out", d / "full").exit_code == 0
    with TraceWriter(d / "s") as w:
        w.write_table("requests", open_trace(d / "full").read("requests").iloc[:60])
    res = run_cli("calibrate", "--from-requests", d / "s", "--max-evals", "25", "--out", d / "p.json")
    assert res.exit_code == 0, res.output
    res = run_cli("estimate", d / "s", "--profile", d / "p.json", "--prefix-cache", "warm", "--estimators",
                  "sfs,throughput", "--lengths", "median", "--out", d / "e")
    assert res.exit_code == 0, res.output
    return d, res.stdout


def test_warm_median_is_over_the_traces_own_requests(request_level):
    d, out = request_level
    own = open_trace(d / "s").read("requests")["output_tokens"].to_numpy(dtype=np.float64)
    median = int(round(float(np.median(np.maximum(own, 1)))))
    assert median > 1
    assert f"lengths median (the trace's median output length, {median} tokens" in out, out
    m = json.loads((d / "e" / "metrics.json").read_text())
    assert f"{median} tokens" in m["policies"]["lengths"]["note"]


def test_warm_median_leaves_the_warm_up_copies_out():
    """The reconstruction's warm-up copies (one output token each, first in
    its requests) do not count in the median: the estimators are told the
    median of the trace's own requests."""
    import pandas as pd

    from estimators.estimate import trace_lengths

    own = pd.DataFrame({"request_id": [10, 11, 12], "output_tokens": [100, 150, 201]})
    warm = own.assign(request_id=[13, 14, 15], output_tokens=1)

    class Fake:
        meta = {"warm_prefix": {"hits": "engine cache", "warmup_requests": 3}}

    lengths = trace_lengths(Fake(), pd.concat([warm, own], ignore_index=True), "median")
    assert list(lengths.tokens) == [150] * 6 and "150 tokens" in lengths.note


def test_request_level_coverage_line_says_why_its_quantiles_coincide(request_level):
    _, out = request_level
    line = next(ln for ln in out.splitlines() if ln.startswith("sfs coverage"))
    p = re.findall(r"p(?:50|90|99) ([\d.]+)%", line)
    assert len(p) == 3 and len(set(p)) == 1, line  # a request-level profile: no noise model
    assert "no noise model" in line, line


# -- 3. the sweep summary's header --------------------------------------------------

def test_sweep_summary_has_no_empty_oracle_column_and_labels_its_rates(results):
    out = (results / "sweep.out").read_text().splitlines()
    head = next(ln for ln in out if ln.startswith("router "))
    assert "of oracle" not in head, head  # no oracle ran: no column of '-'
    assert "q/s" in head, head  # the per-rate columns say what they are
    m = json.loads((results / "sweep" / "metrics.json").read_text())
    rows = [ln for ln in out[out.index(head) + 1:] if ln.split() and ln.split()[0] in m["routers"]]
    assert head.count("q/s") == len(m["rates"]) == 2
    # router, AUC, vs best, one value per rate: no column without a heading
    assert len(rows) == len(m["routers"]) and all(len(r.split()) == 3 + len(m["rates"]) for r in rows), rows


def test_sweep_summary_labels_the_oracle_share_when_an_oracle_ran(results):
    from harness.cli.sweep import format_sweep

    s = json.loads((results / "sweep" / "metrics.json").read_text())
    s["oracle"] = {"router": "oracle", "auc_ontime_utility": 1.0}
    for v in s["routers"].values():
        v["oracle_share"] = v["auc_ontime_utility"]
    head = next(ln for ln in format_sweep(s).splitlines() if ln.startswith("router "))
    assert "of oracle" in head


# -- 4. the demo's first speed ------------------------------------------------------

class _Stop(Exception):
    pass


def test_demo_first_speed_is_steady_state_with_compile_apart(tmp_path, monkeypatch):
    """A compile that takes 1000 s on the demo's clock must not be in the
    first speed the demo prints, and is reported apart."""
    import time
    import types

    import harness.cli.demo as demo
    from harness.cli import cli
    from harness.twin import replay as twin_replay

    offset = [0.0]
    monkeypatch.setattr(demo, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + offset[0]))
    real = twin_replay.warm_up

    def slow_warm_up(*args, **kwargs):
        offset[0] += 1000.0  # the demo's clock jumps 1000 s during the compile
        return real(*args, **kwargs) + 1000.0

    monkeypatch.setattr(twin_replay, "warm_up", slow_warm_up)
    monkeypatch.setattr(demo, "warm_up", slow_warm_up, raising=False)

    def stop(*a, **k):
        raise _Stop

    monkeypatch.setattr(demo, "load_profile", stop)  # step 3 starts: the first speed is printed
    res = CliRunner().invoke(cli, ["demo", "--out", str(tmp_path / "demo")])
    assert "_Stop" in res.output, res.output  # stopped where meant (the CLI reports it as an internal error)
    line = next(ln for ln in res.output.splitlines() if "real time" in ln)
    wall = float(re.search(r" in ([\d.,]+) s", line).group(1).replace(",", ""))
    comp = re.search(r"compile[^\d]*([\d.,]+) s", line)
    assert comp and float(comp.group(1).replace(",", "")) >= 1000.0, line
    assert wall < 1000.0, line  # the compile is not in the timed run


# -- 5. "a estimate" ----------------------------------------------------------------

def test_check_refusal_says_an_estimate_baseline(results, tmp_path):
    base = tmp_path / "b.json"
    assert run_cli("check", results / "est", "--baseline", base, "--write-baseline").exit_code == 0
    res = run_cli("check", results / "sweep", "--baseline", base)
    assert_refused(res, None, "an estimate baseline cannot check a sweep result")
    assert "a estimate" not in res.stderr


def test_no_a_before_a_vowel_in_messages():
    for f in ("reports/check.py", "harness/cli/report.py"):
        text = (ROOT / f).read_text()
        assert not re.search(r"\ba \{(kind|r\.kind|res\.kind|base\[.kind.\])\}", text), f


# -- 6. router colours --------------------------------------------------------------

def _plotly_figures(page: str) -> list[dict]:
    dec, out, key = json.JSONDecoder(), [], "displaylogo: false});})("
    i = page.find(key)
    while i >= 0:
        fig, _ = dec.raw_decode(page, i + len(key))
        out.append(fig)
        i = page.find(key, i + 1)
    return out


def test_ciede2000_matches_sharmas_reference_pairs():
    from reports.colours import ciede2000

    pairs = [((50, 2.6772, -79.7751), (50, 0, -82.7485), 2.0425), ((50, 0, 0), (50, -1, 2), 2.3669),
             ((50, 2.49, -0.001), (50, -2.49, 0.0011), 7.2195), ((50, -0.001, 2.49), (50, 0.0009, -2.49), 4.8045),
             ((50, 2.5, 0), (73, 25, -18), 27.1492), ((60.2574, -34.0099, 36.2677), (60.4626, -34.1751, 39.4387),
                                                      1.2644), ((2.0776, 0.0795, -1.135), (0.9033, -0.0636, -0.5514),
                                                                0.9082)]
    for a, b, want in pairs:
        assert ciede2000(a, b) == pytest.approx(want, abs=1e-4)
        assert ciede2000(b, a) == pytest.approx(want, abs=1e-4)


def test_every_pair_of_router_colours_is_at_least_20_apart(results):
    from reports.colours import delta_e2000

    page = (results / "report" / "interactive.html").read_text()
    colour: dict[str, str] = {}
    for fig in _plotly_figures(page):
        for t in fig["data"]:
            group, c = t.get("legendgroup"), (t.get("line") or {}).get("color")
            if group in DEMO_ROUTERS.split(",") and c:
                assert colour.setdefault(group, c) == c
    assert set(colour) == set(DEMO_ROUTERS.split(",")), colour
    close = [(a, b, round(delta_e2000(colour[a], colour[b]), 1)) for a, b in itertools.combinations(colour, 2)
             if delta_e2000(colour[a], colour[b]) < 20]
    assert not close, close


def test_palette_colours_are_pairwise_distinct_and_read_on_white():
    from reports.colours import MIN_DELTA_E, PALETTE, delta_e2000
    from routers.registry import ROUTERS

    assert len(PALETTE) > len(ROUTERS)  # every built-in router its own colour, one more for a plug-in
    assert min(delta_e2000(a, b) for a, b in itertools.combinations(PALETTE, 2)) >= MIN_DELTA_E
    assert min(delta_e2000(a, "#ffffff") for a in PALETTE) >= MIN_DELTA_E


def test_every_built_in_router_has_its_own_colour_in_every_report():
    """All 22 routers at once are pairwise at least 20 apart, and a router's
    colour does not depend on which others a report shows (a plug-in takes
    one of its own)."""
    from reports.colours import Palette, delta_e2000
    from routers.registry import ROUTERS

    everyone = Palette(list(ROUTERS) + ["my.plugin:Router"], ROUTERS)
    colours = {r: everyone(r) for r in [*ROUTERS, "my.plugin:Router"]}
    close = [(a, b) for a, b in itertools.combinations(colours, 2) if delta_e2000(colours[a], colours[b]) < 20]
    assert not close, close
    few = Palette(["sfs-cc", "shortest-queue"], ROUTERS)
    assert few("sfs-cc") == colours["sfs-cc"] and few("shortest-queue") == colours["shortest-queue"]


# -- 7. the static scatter strip ----------------------------------------------------

def test_static_scatter_panels_are_at_least_300_px_wide(results, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from reports import figures
    from reports.results import load_result
    from reports.series import figure_specs

    spec = {s.name: s for s in figure_specs([load_result(results / "est")])}["estimate_scatter"]
    assert len(spec.panels) == 5
    axes = []
    orig = figures._draw_panel
    monkey = pytest.MonkeyPatch()
    monkey.setattr(figures, "_draw_panel", lambda ax, p: (orig(ax, p), axes.append(ax)))
    try:
        figures.draw_png(spec, tmp_path / "s.png")
    finally:
        monkey.undo()
    png = (tmp_path / "s.png").read_bytes()
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    for ax in axes:
        box = ax.get_position()
        assert box.width * width >= 300 and box.height * height >= 300, (box, width, height)


# -- 8. the serving table -----------------------------------------------------------

def _serving_table_in_chromium(page: Path, tmp_path):
    from tests.reports.test_reports import _headless_chromium

    driver = _headless_chromium(tmp_path)
    try:
        driver.set_window_size(1400, 1000)
        driver.get(page.resolve().as_uri())
        return driver.execute_script("""
            const h = [...document.querySelectorAll('h2')].find(e => e.textContent.startsWith('Serving metrics'));
            let t = h.nextElementSibling; while (t && t.tagName !== 'TABLE') t = t.nextElementSibling;
            const r = t.getBoundingClientRect();
            return {right: r.right, left: r.left, width: document.documentElement.clientWidth,
                    scroll: document.documentElement.scrollWidth};""")
    finally:
        driver.quit()


@pytest.mark.parametrize("page", ["index.html", "interactive.html"])
def test_serving_table_fits_a_1400_px_window(results, tmp_path, page):
    box = _serving_table_in_chromium(results / "report" / page, tmp_path)
    assert box["left"] >= 0 and box["right"] <= box["width"] and box["scroll"] <= box["width"], box


def test_serving_table_says_why_itl_is_missing(results):
    from reports.render import serving_table
    from reports.results import load_result
    from reports.tables import serving_note

    loaded = [load_result(results / "rep"), load_result(results / "sweep")]
    head, rows = serving_table(loaded)
    assert rows and not any(c == "-" for row in rows for c in row[2:6]), rows  # no column of '-'
    note = serving_note(loaded)
    assert "ITL" in note and "token times" in note, note
    assert "token times" in (results / "report" / "index.html").read_text()


# -- 9. the parameter table ---------------------------------------------------------

def test_parameter_table_is_not_raw_json(results):
    from reports.render import params_table
    from reports.results import load_result

    loaded = [load_result(results / n) for n in ("est", "rep", "sweep")]
    head, rows = params_table(loaded)[:2]
    values = [str(r[-1]) for r in rows]
    assert any("lengths" in v or "policy" in v or "column" in v for v in values)
    raw = [v for v in values if re.search(r'[{}\[\]"]', v)]
    assert not raw, raw


# -- 10. reports read results, 11. no report module over 400 lines --------------------

def test_reports_import_no_model_router_or_harness():
    pat = re.compile(r"^\s*(from|import)\s+(estimators|routers|harness)\b", re.M)
    bad = [(p.name, m.group(0).strip()) for p in (ROOT / "reports").glob("*.py") for m in pat.finditer(p.read_text())]
    assert not bad, bad


def test_no_report_module_over_400_lines():
    long = {p.name: n for p in (ROOT / "reports").glob("*.py") if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long
