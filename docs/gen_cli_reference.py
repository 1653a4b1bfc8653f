"""Write docs/reference/cli.md: every latroute command's help, as click prints it.

    python docs/gen_cli_reference.py           # rewrite docs/reference/cli.md
    python docs/gen_cli_reference.py --check   # exit 1 if it differs from what is written

It walks the click group ``harness.cli:cli`` (whose commands are imported
lazily, on ``get_command``) and every subgroup, and formats each command's
help in a fixed 100-column terminal, so the page is the same on every
machine. tests/project/test_docs_reference.py regenerates it and fails on any
difference: the reference cannot drift from the command line.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere: latroute's packages live in the repo root
    sys.path.insert(0, str(ROOT))

OUT = ROOT / "docs" / "reference" / "cli.md"
WIDTH = 100

HEADER = """\
# Command reference

Every `latroute` command's `--help`, generated from the command line itself
by `python docs/gen_cli_reference.py` (do not edit this page by hand; a
test regenerates it and fails on any difference). Options that `vllm bench
serve` also has take its names too (`--request-rate`, `--num-prompts`,
`--result-dir`, `--num-seeds`). Exit statuses: 0 success, 1 a failed check
or run (or an internal error), 2 bad input, 130 interrupted
([bad input and exit statuses](errors.md)).
"""


def _walk(cmd: click.Command, ctx: click.Context, path: list[str]):
    """(path, command, help text) for ``cmd`` and every command under it, depth first, in listing order."""
    yield path, cmd, cmd.get_help(ctx)
    if isinstance(cmd, click.Group):
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            sub_ctx = click.Context(sub, info_name=name, parent=ctx, **sub.context_settings)
            yield from _walk(sub, sub_ctx, [*path, name])


def one_line_help(path: list[str], cmd: click.Command) -> str:
    """The line ``--help`` lists the command with, untruncated: a top-level
    command's from ``harness.cli.COMMANDS`` (what ``latroute --help`` shows
    without importing the command), a subcommand's the first sentence of
    its help, as its group's ``--help`` lists it."""
    from harness.cli import COMMANDS

    if len(path) == 2 and path[1] in COMMANDS:
        return COMMANDS[path[1]][1]
    return cmd.get_short_help_str(limit=1_000)


def render() -> str:
    # Defaults that follow the machine (sweep's --workers: min(cores, 2)) are shown as on a 2-core
    # machine, so the page is the same everywhere; run in a fresh process (the commands' modules are
    # imported here, while the patch holds).
    real_cpu_count = os.cpu_count
    os.cpu_count = lambda: 2
    try:
        return _render()
    finally:
        os.cpu_count = real_cpu_count


def _render() -> str:
    from harness.cli import cli

    settings = {**cli.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    ctx = click.Context(cli, info_name="latroute", **settings)
    entries = list(_walk(cli, ctx, ["latroute"]))
    lines = [HEADER, "| command | what it does |", "|---|---|"]
    for path, cmd, _ in entries[1:]:
        anchor = "-".join(path)
        cell = one_line_help(path, cmd).replace("|", r"\|")  # a pipe would end the table cell
        lines.append(f"| [`{' '.join(path)}`](#{anchor}) | {cell} |")
    lines.append("")
    for path, _, text in entries:
        anchor = "-".join(path)
        lines += [f"## {' '.join(path)} {{#{anchor}}}", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python docs/gen_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
