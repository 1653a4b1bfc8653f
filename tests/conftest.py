"""Shared test helpers: the CLI runner and the location of ../shared/data.

Tests that read the shared data skip cleanly when it is absent (set
LATROUTE_SHARED_DATA to point elsewhere)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import cli

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("LATROUTE_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared(*parts: str) -> Path:
    """Path under the shared data directory; skips the test if it is missing."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not available: {path}")
    return path


def run_cli(*args: str):
    """Invoke ``latroute`` in-process; returns click's Result (exit_code,
    stdout, stderr)."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def assert_refused(result, out: Path | None, *fragments: str) -> None:
    """A refusal: exit 2, one line on stderr naming what is wrong, nothing written."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    if out is not None:
        assert not out.exists(), f"{out} was written"
        leftovers = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
        assert not leftovers, leftovers


@pytest.fixture(scope="session")
def recordings(tmp_path_factory):
    """Every recording of ../shared/data/vllm_cpu imported once per session."""
    root = shared("vllm_cpu")
    out = tmp_path_factory.mktemp("rec")
    for rec in sorted(p for p in root.iterdir() if p.is_dir()):
        assert run_cli("trace", "import", "vllm-record", rec, "--out", out / rec.name).exit_code == 0
    return out
