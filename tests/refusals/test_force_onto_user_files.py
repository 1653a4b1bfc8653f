"""``--force`` onto a directory latroute wrote removes only what latroute
wrote there: a user's file, a FIFO or a device node put inside
it since are named and refused, nothing removed."""
from __future__ import annotations

import os
import stat

import pytest

from tests.conftest import run_cli
from tests.support.clean_refusal import refused_cleanly


def _generate(out, *extra):
    return run_cli("trace", "generate", "--out", out, "--requests", "10", "--rate", "5", *extra)


def _device(p):
    try:
        os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod of a character device needs root")


@pytest.mark.parametrize("add, fragment", [
    (lambda d: (d / "notes.txt").write_text("keep me"), "notes.txt"),
    (lambda d: os.mkfifo(d / "pipe"), "named pipe"),
    (lambda d: _device(d / "null"), "character device"),
    (lambda d: (d / "mine").mkdir(), "mine"),
], ids=["file", "fifo", "device", "directory"])
def test_force_refuses_what_was_added_to_a_latroute_output(tmp_path, add, fragment):
    out = tmp_path / "wl"
    assert _generate(out).exit_code == 0
    add(out)
    refused_cleanly(["trace", "generate", "--out", out, "--requests", "10", "--rate", "5", "--force"],
                    [tmp_path], "--out", fragment, "latroute")


def test_force_still_replaces_latroute_s_own_output(tmp_path):
    out = tmp_path / "wl"
    assert _generate(out).exit_code == 0
    marker = (out / ".latroute").read_text().splitlines()
    assert marker[1:] and all(line[:2] in ("f ", "d ") for line in marker[1:])
    res = _generate(out, "--force", "--seed", "3")
    assert res.exit_code == 0, res.output
