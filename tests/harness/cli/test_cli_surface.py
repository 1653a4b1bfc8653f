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
    from harness.cli.trace import DEFAULT_CHUNK_ROWS
    from traces.importers.common import DEFAULT_CHUNK_ROWS as IMPORTERS

    assert DEFAULT_CHUNK_ROWS == IMPORTERS


def _walk(cmd: click.Command, path: list[str]):
    ctx = click.Context(cli)
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            yield from _walk(cmd.get_command(ctx, name), path + [name])
    else:
        yield " ".join(path), cmd


def test_every_option_of_every_command_has_help():
    missing = [(name, p.opts) for name, cmd in _walk(cli, []) for p in cmd.params
               if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()]
    assert not missing, missing


def test_vllm_flag_names_are_accepted(tmp_path):
    from tests.conftest import run_cli

    res = run_cli("replay", "--request-rate", 6, "--num-prompts", 60, "--router", "shortest-queue",
                  "--result-dir", tmp_path / "r")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["workload"]["rate"] == 6 and m["workload"]["requests"] == 60
    res = run_cli("sweep", "--rates", "6", "--num-prompts", 40, "--routers", "shortest-queue", "--num-seeds", 2,
                  "--seed", 3, "--workers", 1, "--result-dir", tmp_path / "s")
    assert res.exit_code == 0, res.output
    import pandas as pd

    assert sorted(pd.read_parquet(tmp_path / "s" / "results.parquet")["seed"]) == [3, 4]


def test_list_builtins():
    from tests.conftest import run_cli

    for kind, expect in (("pools", "qwen3-h100"), ("profiles", "qwen3-8b-h100"), ("routers", "sfs-soft"),
                         ("estimators", "lps-mg")):
        res = run_cli("list", kind)
        assert res.exit_code == 0 and expect in res.stdout, (kind, res.output)
    rows = json.loads(run_cli("list", "routers", "--json").stdout)
    from routers.registry import ROUTERS

    assert [r["name"] for r in rows] == ROUTERS


def test_router_plugin_by_import_path(tmp_path):
    from tests.conftest import run_cli

    res = run_cli("replay", "--rate", 4, "--requests", 40, "--router", "tests.plugin_router:LastInstance",
                  "--out", tmp_path / "r")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())
    assert m["share_by_instance"] == {"qwen3-0.6b": 0.0, "qwen3-8b": 0.0, "qwen3-32b": 1.0}
    res = run_cli("replay", "--rate", 4, "--requests", 40, "--router", "tests.plugin_router:Nope", "--out",
                  tmp_path / "x")
    assert res.exit_code == 2 and "cannot be loaded" in res.output


def test_estimator_plugin_by_import_path(tmp_path):
    from tests.conftest import run_cli

    served = tmp_path / "r"
    assert run_cli("replay", "--rate", 4, "--requests", 60, "--router", "shortest-queue", "--record-steps",
                   "--out", served).exit_code == 0
    res = run_cli("estimate", served / "served", "--calibrate-on", served / "served", "--estimators",
                  "sfs,tests.plugin_router:TwiceThroughput", "--out", tmp_path / "e")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "e" / "metrics.json").read_text())["estimators"]
    assert set(m) == {"sfs", "tests.plugin_router:TwiceThroughput"}
    assert m["tests.plugin_router:TwiceThroughput"]["n"] == m["sfs"]["n"] > 0
