"""Docs that cannot drift, the fast part, in the default suite:
the command reference is regenerated from click's own help and must equal
docs/reference/cli.md; the README keeps its shape (the two set-up commands
first, at most 250 lines, every docs link resolving)."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import REPO

SETUP = ['python -m pip install -e ".[dev]" && latroute demo',
         'python -m pip install -e ".[dev]" && python -m pytest -q']


def test_cli_reference_is_generated_from_click_help():
    # a fresh process: the generator imports every command module with the machine-dependent defaults pinned
    proc = subprocess.run([sys.executable, str(REPO / "docs" / "gen_cli_reference.py"), "--check"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr + "\n(run: python docs/gen_cli_reference.py)"


def test_cli_reference_names_every_command():
    from harness.cli import COMMANDS

    text = (REPO / "docs" / "reference" / "cli.md").read_text()
    for name in COMMANDS:
        assert f"## latroute {name} {{#latroute-{name}}}" in text, name
    for sub in ("trace import", "trace generate", "trace query", "trace info", "trace join", "record engine"):
        assert f"## latroute {sub} " in text, sub


def test_readme_starts_with_the_two_setup_commands_and_is_short():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first and first.group(1).strip().splitlines() == SETUP


def test_readme_links_into_docs_resolve():
    text = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\((docs/[^)#\s]+)", text)
    assert targets
    for t in targets:
        assert (REPO / t).is_file(), t


def test_readme_bash_blocks_parse():
    """Every README shell block is valid bash (the vLLM ones too, which only run where vLLM is)."""
    from tests.project.test_readme_walkthrough import bash_blocks

    for n, block in enumerate(bash_blocks((REPO / "README.md").read_text()), start=1):
        proc = subprocess.run(["bash", "-n", "-c", block], capture_output=True, text=True)
        assert proc.returncode == 0, (n, block, proc.stderr)


def test_source_files_the_docs_name_exist():
    """A page that names `harness/twin/loop/kernel.py` or `estimators/engine/block_pool.py`
    goes stale when the file moves (two such names were once left behind by a move)."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    not_ours = {"tests/v1/core/test_scheduler.py"}  # vLLM's own scheduler tests, which the peer suite follows
    missing = []
    for page in pages:
        for name in re.findall(r"(?<![\w/.-])((?:harness|estimators|traces|routers|reports|tests|docs)/[\w/]*\.py)\b",
                               page.read_text()):
            if name not in not_ours and not (REPO / name).is_file():
                missing.append((page.relative_to(REPO).as_posix(), name))
    assert not missing, missing


def test_route_page_says_a_real_vllm_publishes_the_state_feed_as_the_code_does(tmp_path):
    """The recording scheduler serves a real vLLM's state feed
    (traces.vllm_recorder.state_feed) and a pool entry's ``state_url`` points
    the proxy at it: the route page says so, names the variable and the pool
    field the code reads, and does not also list that feed as not there yet."""
    import json

    from harness.twin.pools.spec import load_pool
    from traces.vllm_recorder.state_feed import ENV_LISTEN

    text = (REPO / "docs" / "how-to" / "route.md").read_text()
    assert f"`{ENV_LISTEN}=127.0.0.1:PORT`" in text
    entry = json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))  # the page's pool entry
    (tmp_path / "pool.json").write_text(json.dumps({"instances": [entry]}))
    assert load_pool(tmp_path / "pool.json").state_urls == (entry["state_url"],)
    not_yet = text.split("## Not here yet", 1)[1].split("\n## ", 1)[0]
    assert "state feed" not in " ".join(not_yet.split()).lower(), not_yet


def test_cli_reference_table_gives_each_command_its_help_line():
    """The reference's command table says what each command does, in the
    words ``--help`` lists it with: a top-level command's line from
    ``harness.cli.COMMANDS``, a subcommand's the first sentence of its help
    (the description column was empty)."""
    import click

    from harness.cli import COMMANDS, cli

    text = (REPO / "docs" / "reference" / "cli.md").read_text()
    rows = re.findall(r"^\| \[`latroute ([^`]+)`\]\(#[\w-]+\) \|(.*)\|$", text, re.M)
    assert {name for name, _ in rows} >= set(COMMANDS) | {"trace join", "record finish"}
    ctx = click.Context(cli, info_name="latroute")
    for name, cell in rows:
        cell = cell.strip().replace(r"\|", "|")
        assert cell, f"latroute {name}: empty description"
        top, *sub = name.split()
        if not sub:
            assert cell == COMMANDS[top][1], name
        else:
            cmd = cli.get_command(ctx, top)
            for part in sub:  # a group's subcommand, or a subgroup's (study route-live serve)
                cmd = cmd.get_command(ctx, part)
            assert cell == cmd.get_short_help_str(limit=1_000), name
            assert cell.endswith(".") and not cell.endswith("..."), name  # whole, not click's truncation


def test_every_how_to_page_is_listed_in_the_docs_index_and_the_readme():
    """Each page under docs/how-to/ is linked from the site's index and from
    the README's How-to list (the serve and route pages were in neither)."""
    pages = sorted(p.name for p in (REPO / "docs" / "how-to").glob("*.md"))
    assert {"serve.md", "route.md"} <= set(pages)
    index = set(re.findall(r"\]\(how-to/([\w.-]+\.md)\)", (REPO / "docs" / "index.md").read_text()))
    readme = (REPO / "README.md").read_text()
    how_to = re.search(r"^- \*\*How-to\*\*:(.*?)^- ", readme, re.S | re.M)
    assert how_to, "the README has no How-to list"
    listed = set(re.findall(r"\]\(docs/how-to/([\w.-]+\.md)\)", how_to.group(1)))
    assert [p for p in pages if p not in index] == [], "not linked from docs/index.md"
    assert [p for p in pages if p not in listed] == [], "not in the README's How-to list"
