"""Every study runs as ``latroute study NAME``, the one way the results pages
name: no study module keeps a script entry of its own, ``docs/`` holds only
the generators of its figures and reference, no page or docstring tells a
user to run a module or a script, and a study given the wrong kind of
input directory refuses it in one line before any work (the studies run
for minutes to hours: a traceback at the end would cost all of it)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.clean_refusal import refused_cleanly

ROOT = Path(__file__).resolve().parents[2]


def test_no_study_module_is_a_script():
    scripts = [p.name for p in sorted((ROOT / "harness" / "studies").glob("*.py"))
               if re.search(r'^if __name__ == "__main__"|^import argparse', p.read_text(), re.M)]
    assert scripts == [], f"run these as latroute study NAME (harness/cli/study.py): {scripts}"


def test_docs_holds_only_its_generators():
    assert sorted(p.name for p in (ROOT / "docs").rglob("*.py")) == ["gen_cli_reference.py", "regenerate_figures.py"]


def test_no_text_tells_a_user_to_run_a_study_module_or_script():
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "harness").rglob("*.py")),
             *sorted((ROOT / "reports").rglob("*.py"))]
    pattern = re.compile(r"python -m (harness\.studies|reports)\.|python docs/(?!gen_cli_reference|regenerate_figures)")
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in texts for m in pattern.finditer(p.read_text())]
    assert found == [], found


def test_every_study_module_has_its_command():
    """A module with a study's entry (``study`` or ``run``) is reached from harness/cli/study.py."""
    cli = (ROOT / "harness" / "cli" / "study.py").read_text()
    entries = [p.stem for p in sorted((ROOT / "harness" / "studies").glob("*.py"))
               if re.search(r"^def (study|run)\(", p.read_text(), re.M)]
    assert entries, "no study entry found: the check would pass vacuously"
    missing = [m for m in entries if f"harness.studies.{m} import" not in cli
               and f"harness.studies import {m}" not in cli]
    assert missing == [], missing


@pytest.mark.parametrize("args,fragment", [
    (["fleet-acceptance", "{d}"], "sweep.json"),
    (["router-shares", "{d}"], "sweep.json"),
    (["route-live", "report", "{d}"], "results.json"),
    (["fleet-diagnosis-figure", "{d}", "--out", "{d}/fig.png"], "decisions.parquet"),
    (["serve-real-drift", "{d}"], "real2/join/join.parquet"),
    (["serve-real", "{d}", "--compare-only"], "real2/join/join.parquet"),
    (["coverage", "{d}", "{d}/cov.json"], "holds no recording"),
])
def test_a_study_refuses_the_wrong_directory_in_one_line(tmp_path, args, fragment):
    if args[0] == "serve-real":  # run against real servers: the serve extra first, refused before its options
        pytest.importorskip("prometheus_client", reason="latroute study serve-real needs the serve extra")
    d = tmp_path / "not-a-study"
    d.mkdir()
    refused_cleanly(["study", *(a.format(d=d) for a in args)], [tmp_path], fragment)


def test_serve_real_refuses_options_that_would_do_nothing(tmp_path):
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    refused_cleanly(["study", "serve-real", tmp_path / "o", "--compare-only", "--only", "real1"], [tmp_path],
                    "--compare-only")
    refused_cleanly(["study", "serve-real", tmp_path / "o", "--only", "real9", "--workload", tmp_path], [tmp_path],
                    "--only", "real9")
    refused_cleanly(["study", "serve-real", tmp_path / "o"], [tmp_path], "--workload")


def test_route_live_refuses_options_that_would_do_nothing_or_mean_nothing(tmp_path):
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    pool = ROOT / "docs" / "pools" / "tiny-ab.json"
    refused_cleanly(["study", "route-live", "real", tmp_path / "o", "--pool", pool, "--calibrate-only"], [tmp_path],
                    "--calibrate-only", "--calibrate")
    refused_cleanly(["study", "route-live", "serve", tmp_path / "o", "--views", "exact,metrics:0"], [tmp_path],
                    "--views", "metrics:0")
    refused_cleanly(["study", "route-live", "backends", tmp_path / "o", "--pool", pool, "--trace", tmp_path,
                     "--view", "exact,ledger"], [tmp_path], "--view")
