"""The CLI's surface: lazy start-up (no heavy imports for --help), every
command registered by import path resolves, every option has help."""
from __future__ import annotations

import json
import subprocess
import sys

import click

from harness.cli import COMMANDS, cli
from tests.conftest import REPO

HEAVY = ("numba", "matplotlib", "pandas")


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
                         cwd=REPO, capture_output=True, text=True, check=True, env={"PYTHONPATH": str(REPO)})
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_help_imports_no_heavy_module():
    mods = _modules_after("from harness.cli import cli\ntry:\n    cli(['--help'])\nexcept SystemExit:\n    pass")
    assert not [m for m in HEAVY if m in mods], [m for m in HEAVY if m in mods]


def test_trace_info_imports_no_pandas_numba_matplotlib(tmp_path):
    from tests.conftest import run_cli

    out = tmp_path / "wl"
    assert run_cli("trace", "generate", "--requests", 20, "--rate", 5, "--out", out).exit_code == 0
    mods = _modules_after(f"from harness.cli import cli\ntry:\n    cli(['trace', 'info', {str(out)!r}])\n"
                          "except SystemExit:\n    pass")
    assert "duckdb" in mods and not [m for m in HEAVY if m in mods], [m for m in HEAVY if m in mods]


def test_every_registered_command_resolves():
    ctx = click.Context(cli)
    for name in COMMANDS:
        cmd = cli.get_command(ctx, name)
        assert isinstance(cmd, click.Command) and cmd.name == name, name


def test_chunk_rows_default_mirrors_importers():
    from harness.cli_trace import DEFAULT_CHUNK_ROWS
    from traces.importers.common import DEFAULT_CHUNK_ROWS as IMPORTERS

    assert DEFAULT_CHUNK_ROWS == IMPORTERS
