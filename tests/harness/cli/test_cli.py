"""The command line end to end: info, query, demo, bench, help."""
from __future__ import annotations

import json

import pytest

from tests.conftest import assert_refused, run_cli
from tests.traces.importers.test_importers import AZURE, write


@pytest.fixture()
def generated(tmp_path):
    out = tmp_path / "wl"
    res = run_cli("trace", "generate", "--requests", 500, "--rate", 5, "--out", out)
    assert res.exit_code == 0, res.output
    return out


def test_info_text_and_json(generated):
    res = run_cli("trace", "info", generated)
    assert res.exit_code == 0, res.output
    assert "500 over" in res.stdout and "quality (1,500 rows)" in res.stdout
    info = json.loads(run_cli("trace", "info", generated, "--json").stdout)
    assert info["tables"] == {"requests": 500, "quality": 1500}
    assert info["requests"]["count"] == 500 and abs(info["requests"]["rate_per_s"] / 5 - 1) < 0.15
    assert info["prompt_tokens"]["p50"] > 0 and set(info["tasks"]) == {"alpaca", "govreport", "hotpotqa", "writingprompts"}


def test_query_formats_on_generated_and_imported(generated, tmp_path):
    res = run_cli("trace", "query", generated, "select count(*) as n from requests")
    assert res.exit_code == 0 and "500" in res.stdout
    res = run_cli("trace", "query", generated, "select count(*) as n from requests", "--format", "csv")
    assert res.stdout.splitlines() == ["n", "500"]
    res = run_cli("trace", "query", generated,
                  "select model, count(*) as n from quality group by model order by model", "--format", "json")
    assert json.loads(res.stdout) == [{"model": m, "n": 500} for m in ("qwen3-0.6b", "qwen3-32b", "qwen3-8b")]
    src = write(tmp_path, "az.csv", AZURE)
    assert run_cli("trace", "import", "azure", src, "--out", tmp_path / "az").exit_code == 0
    res = run_cli("trace", "query", tmp_path / "az", "select count(*) as n from requests", "--format", "csv")
    assert res.stdout.splitlines() == ["n", "3"]


def test_query_errors_are_one_line(generated):
    assert_refused(run_cli("trace", "query", generated, "select * from steps"), None, "SQL", "steps")
    assert_refused(run_cli("trace", "query", generated, "selec 1"), None, "SQL", "syntax")


def test_demo_writes_a_trace_and_says_where(tmp_path):
    res = run_cli("demo", "--out", tmp_path / "demo")
    assert res.exit_code == 0, res.output
    assert str((tmp_path / "demo").resolve()) in res.stdout
    info = json.loads(run_cli("trace", "info", tmp_path / "demo" / "workload", "--json").stdout)
    assert info["requests"]["count"] > 0
    assert "held-out MAPE" in res.stdout and "<- chosen" in res.stdout
    prof = json.loads((tmp_path / "demo" / "profile.json").read_text())
    assert prof["metrics"]["holdout"]["mape"] < 0.06
    index = tmp_path / "demo" / "report" / "index.html"
    assert str(index.resolve()) in res.stdout.splitlines()[-3] or str(index.resolve()) in res.stdout
    import base64
    import re
    html = index.read_text()
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    # 9: the TTFT reliability diagram joined the 8 (the demo's estimate has SFS quantiles)
    assert len(imgs) == 9 and all(base64.b64decode(i).startswith(b"\x89PNG") for i in imgs)


def test_bench_small(tmp_path):
    res = run_cli("bench", "--generate-requests", 2000, "--import-rows", 5000, "--twin-requests", 300,
                  "--workdir", tmp_path, "--json", "--only", "generate", "--only", "import", "--only", "twin")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["generate"]["requests"] == 2000 and out["import"]["rows"] == 5000
    assert out["import"]["peak_rss_mb"] > 0
    assert out["twin"]["requests"] == 300 and out["twin"]["steps"] > 0 and out["twin"]["speedup"] > 0


def test_every_command_has_help_with_examples():
    for args in (["trace", "info"], ["trace", "query"], ["trace", "generate"], ["trace", "import"], ["demo"],
                 ["bench"], ["calibrate"], ["validate"], ["estimate"], ["replay"], ["sweep"], ["report"], ["check"]):
        res = run_cli(*args, "--help")
        assert res.exit_code == 0 and "Example" in res.stdout, args
