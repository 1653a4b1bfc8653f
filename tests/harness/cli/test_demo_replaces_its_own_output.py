"""``latroute demo --out``: the demo replaces its own earlier
outputs on every run, and nothing else. It wrote into a directory of
someone's files (and replaced its subdirectories) with exit 0."""
from __future__ import annotations

import os

import pytest

from tests.support.clean_refusal import refused_cleanly


@pytest.mark.parametrize("target", ["foreign", "file", "fifo", "cwd"])
def test_demo_refuses_what_it_did_not_write(tmp_path, monkeypatch, target):
    if target == "foreign":
        out = tmp_path / "mine"
        out.mkdir()
        (out / "notes.txt").write_text("keep me")
        (out / "report").mkdir()
    elif target == "file":
        out = tmp_path / "f"
        out.write_text("keep me")
    elif target == "fifo":
        out = tmp_path / "p"
        os.mkfifo(out)
    else:
        monkeypatch.chdir(tmp_path)
        out = tmp_path
    refused_cleanly(["demo", "--out", out], [tmp_path], "--out")
