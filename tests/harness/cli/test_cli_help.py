"""Every command's ``--help`` answers without loading the numeric stack.

The commands are enumerated from the group itself (``harness.cli.COMMANDS``
and each group's ``list_commands``, recursively), so a command added later
is covered without editing this file. Importing the command's module, then
rendering its help, in a fresh interpreter loads none of numba, numpy,
pandas, duckdb, pyarrow, matplotlib or plotly: what made a help slow. (No
timed check: a wall-clock ratio fails whenever the machine is busy, and
speed is ``latroute bench``'s to measure.)
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys

import click
import pytest

from harness.cli import COMMANDS, cli
from tests.conftest import REPO

HEAVY = ("numba", "numpy", "pandas", "duckdb", "pyarrow", "matplotlib", "plotly")


def _walk(cmd: click.Command, path: tuple[str, ...], ctx: click.Context):
    yield path, cmd
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            yield from _walk(sub, (*path, name), click.Context(sub, parent=ctx, info_name=name))


def command_paths() -> dict[tuple[str, ...], str]:
    """Every command and subcommand (``("trace", "join")``) -> the module that defines it."""
    root = click.Context(cli, info_name="latroute")
    names = cli.list_commands(root)
    assert set(COMMANDS) <= set(names), sorted(set(COMMANDS) - set(names))
    out = {}
    for name in names:
        cmd = cli.get_command(root, name)
        for path, sub in _walk(cmd, (name,), click.Context(cmd, parent=root, info_name=name)):
            out[path] = sub.callback.__module__
    return out


PATHS = command_paths()


def test_every_command_is_enumerated():
    """The walk reaches subcommands of groups, not only the top level (guards the enumeration itself)."""
    assert {("trace", "join"), ("trace", "import"), ("record", "engine"), ("record", "finish")} <= set(PATHS)
    assert {p[0] for p in PATHS} == set(COMMANDS)


# A fresh interpreter: import the command's module, note what is loaded, render its help as `latroute` does,
# note again. Printed as JSON on the last line of stdout (the help text comes before it).
_PROBE = """
import contextlib, io, json, sys, importlib
heavy = {heavy!r}
importlib.import_module({module!r})
after_import = sorted(m for m in heavy if m in sys.modules)
from harness.cli import cli
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        cli.main([*{path!r}, "--help"], prog_name="latroute")
    except SystemExit as e:
        status = e.code
after_help = sorted(m for m in heavy if m in sys.modules)
print(json.dumps({{"import": after_import, "help": after_help, "status": status, "chars": len(out.getvalue())}}))
"""


@pytest.mark.parametrize("path", sorted(PATHS), ids=" ".join)
def test_help_loads_no_heavy_module(path):
    module = PATHS[path]
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(heavy=HEAVY, module=module, path=list(path))],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["status"] == 0 and got["chars"] > 0, got
    assert got["import"] == [], f"import {module} loads {got['import']}"
    assert got["help"] == [], f"latroute {' '.join(path)} --help loads {got['help']}"


def test_help_names_match_the_modules_that_own_them():
    """The choices and defaults the help shows (harness.cli.choices) are the
    owners' own: a router, estimator or policy added there must be added there too."""
    import harness.cli.choices as choices

    differ = []
    for name, owner, attr in choices.MIRRORED:
        theirs = getattr(importlib.import_module(owner), attr)
        if isinstance(theirs, list | tuple | dict):
            theirs = tuple(theirs)
        if getattr(choices, name) != theirs:
            differ.append(f"harness.cli.choices.{name} = {getattr(choices, name)!r}, {owner}.{attr} = {theirs!r}")
    assert not differ, differ
    kept = {n for n in vars(choices) if n.isupper() and n != "MIRRORED"}
    assert kept == {m[0] for m in choices.MIRRORED}, "every name kept there is checked here"
