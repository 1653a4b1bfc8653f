"""The architecture page (docs/concepts/architecture.md) cannot drift from
the code: every file, folder and dotted module it names exists, every room
of the five packages is named on it (a room added without a line there
fails here), every import contract of pyproject.toml is in its table, and
the site, its index and the README link to it. The checks are functions of
the page's text, so the last tests feed them an edited page and see them
catch the edit."""
from __future__ import annotations

import ast
import re
import tomllib
from functools import cache
from pathlib import Path

from tests.conftest import REPO

PAGE = REPO / "docs" / "concepts" / "architecture.md"
PACKAGES = ("harness", "estimators", "traces", "routers", "reports")
# a path under one of ours, not inside a longer path or URL (vLLM's own tests/... at a tag are not ours)
PATH = re.compile(r"(?<![\w/.-])((?:harness|estimators|traces|routers|reports|tests|docs)/[\w./-]*[\w/])")
DOTTED = re.compile(r"`((?:harness|estimators|traces|routers|reports)(?:\.\w+)+)")
NOT_OURS = {"tests/v1/core/test_scheduler.py"}  # vLLM's scheduler tests, cited by URL


def named_paths(text: str) -> set[str]:
    return {p for p in PATH.findall(text) if p not in NOT_OURS}


def missing_paths(text: str, root: Path = REPO) -> list[str]:
    """The paths the page names that are neither a file nor a folder."""
    return sorted(p for p in named_paths(text) if not (root / p).exists())


@cache
def _top_names(module: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level."""
    names = set()
    for node in ast.parse(module.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def unresolved_dotted(text: str, root: Path = REPO) -> list[str]:
    """Dotted names (``routers.base.Router``) whose modules do not exist, or
    whose first name after the module is not defined at its top level."""
    bad = []
    for name in sorted(set(DOTTED.findall(text))):
        parts = name.split(".")
        k, module = 1, None
        while k < len(parts) and ((root / Path(*parts[:k + 1])).is_dir() or
                                  (root / Path(*parts[:k + 1])).with_suffix(".py").is_file()):
            k += 1
        here = root / Path(*parts[:k])
        module = here / "__init__.py" if here.is_dir() else here.with_suffix(".py")
        if k < len(parts) and (not module.is_file() or parts[k] not in _top_names(module)):
            bad.append(name)
    return bad


def rooms(root: Path = REPO) -> list[str]:
    """Every top-level room of the five packages, as the page names it:
    ``pkg/room/`` for a subpackage, ``pkg/module.py`` for a module."""
    out = []
    for pkg in PACKAGES:
        for p in sorted((root / pkg).iterdir()):
            if p.is_dir() and (p / "__init__.py").is_file():
                out.append(f"{pkg}/{p.name}/")
            elif p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py"):
                out.append(f"{pkg}/{p.name}")
    return out


def unnamed_rooms(text: str, root: Path = REPO) -> list[str]:
    named = named_paths(text)
    return [r for r in rooms(root) if r not in named and r.rstrip("/") not in named]


def contract_ids() -> list[str]:
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [c["id"] for c in doc["tool"]["importlinter"]["contracts"]]


def test_every_path_the_page_names_exists():
    text = PAGE.read_text()
    assert len(named_paths(text)) > 100, "the page names the modules each flow passes through"
    assert missing_paths(text) == [], "named on docs/concepts/architecture.md, not in the repository"


def test_every_dotted_name_the_page_uses_resolves():
    assert unresolved_dotted(PAGE.read_text()) == []


def test_every_room_of_the_five_packages_is_named():
    assert len(rooms()) > 40
    assert unnamed_rooms(PAGE.read_text()) == [], "a room with no line on docs/concepts/architecture.md"


def test_every_import_contract_is_in_the_layers_table():
    text = PAGE.read_text()
    ids = contract_ids()
    assert "layers" in ids and "engine" in ids
    assert [i for i in ids if f"| `{i}` |" not in text] == []


def test_vllm_is_cited_at_a_checked_release():
    """Every vLLM source the page links is at the tag of a release the kernel was checked against."""
    from traces.vllm_releases.versions import CHECKED_VLLM_VERSIONS

    tags = re.findall(r"https://github\.com/vllm-project/vllm/blob/([^/]+)/", PAGE.read_text())
    assert len(tags) >= 10
    assert {t for t in tags if t.removeprefix("v") not in CHECKED_VLLM_VERSIONS} == set()


def test_the_page_is_in_the_nav_the_index_and_the_readme():
    assert "concepts/architecture.md" in (REPO / "mkdocs.yml").read_text()
    assert "](concepts/architecture.md)" in (REPO / "docs" / "index.md").read_text()
    assert "](docs/concepts/architecture.md)" in (REPO / "README.md").read_text()


def test_the_checks_catch_a_renamed_path_and_a_dropped_room():
    text = PAGE.read_text()
    assert "harness/twin/simulation.py" in text and "`routers/oracle.py`" in text
    renamed = text.replace("harness/twin/simulation.py", "harness/twin/simulator.py", 1)
    assert missing_paths(renamed) == ["harness/twin/simulator.py"]
    assert unresolved_dotted(text + "\n`routers.base.NoSuchRouter` `harness.twin.nosuchroom`") == [
        "harness.twin.nosuchroom", "routers.base.NoSuchRouter"]
    dropped = text.replace("`routers/oracle.py`", "the oracle")
    assert "routers/oracle.py" not in dropped
    assert unnamed_rooms(dropped) == ["routers/oracle.py"]


def test_a_new_room_must_be_named(tmp_path):
    """A package with one room more than the page names fails the room check."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        for r in rooms():
            if r.startswith(pkg + "/"):
                target = tmp_path / r
                if r.endswith("/"):
                    target.mkdir()
                    (target / "__init__.py").write_text("")
                else:
                    target.write_text("")
    text = PAGE.read_text()
    assert unnamed_rooms(text, tmp_path) == []
    (tmp_path / "traces" / "newroom").mkdir()
    (tmp_path / "traces" / "newroom" / "__init__.py").write_text("")
    (tmp_path / "routers" / "new_router.py").write_text("")
    assert unnamed_rooms(text, tmp_path) == ["traces/newroom/", "routers/new_router.py"]
