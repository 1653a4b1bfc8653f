"""Studies run as ``python -m harness.studies.NAME`` answer bad arguments as latroute does: one
line ``error: python -m harness.studies.NAME: ...``, exit 2 (no argparse usage block, no traceback)."""
from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    ("coverage", [], "the following arguments are required: recordings, out"),
    ("coverage", ["{tmp}/none", "{tmp}/c.json"], "recordings: not a directory"),
    ("coverage", ["{tmp}", "{tmp}/c.json", "--recalibrate=nan"], "--recalibrate: must be a finite number"),
    ("fleet_diagnosis", ["--rate", "nan", "--requests", "5", "--out", "{tmp}/d"], "--rate: must be a finite number"),
    ("fleet_diagnosis", ["--rate", "1", "--requests", "1e11", "--out", "{tmp}/d"], "--requests: must be a whole"),
    ("fleet_diagnosis", ["--rate", "1", "--requests", "5", "--pool", "nope", "--out", "{tmp}/d"], "nope: pool:"),
    ("fleet_acceptance", ["{tmp}/none"], "FileNotFoundError"),
    ("router_shares", ["{tmp}/none"], "No such file"),
    ("route_views", ["--speed", "1e300"], "--speed: must be a finite number in [0.001, 1e+06]"),
    ("route_live", [], "the following arguments are required: cmd"),
    ("route_live", ["serve", "{tmp}/o", "--seed", "-1"], "route_live serve: argument --seed: must be a whole"),
]


@pytest.mark.parametrize("study,args,frag", CASES)
def test_a_study_refuses_bad_arguments_in_one_line(tmp_path, study, args, frag):
    argv = [a.format(tmp=tmp_path) for a in args]
    p = subprocess.run([sys.executable, "-m", f"harness.studies.{study}", *argv], capture_output=True, text=True,
                       timeout=120)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith(f"error: python -m harness.studies.{study}"), lines
    assert frag in lines[0], lines[0]
    assert not (tmp_path / "d").exists() and not (tmp_path / "c.json").exists()
