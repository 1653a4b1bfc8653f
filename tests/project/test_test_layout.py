"""The test tree mirrors the code, and its file names say what they check.

Why: a newcomer who changes a package finds the tests that guard it in the
folder of the same path (``tests/estimators/engine/`` guards
``estimators/engine/``), and a file's name says what behaviour it guards,
not when or why it was written (a name like a review campaign's or a work
round's tells nobody which code it protects).

The rules, each checked below on the real tree and, to show the check can
fail, on a small tree made here:

- every ``test_*.py`` sits in a folder ``tests/a/b/`` where ``a/b/`` is a
  package of the project (it has an ``__init__.py``), or under one of the
  folders in ``NON_PACKAGE`` (house-wide checks and refusals, which span
  packages); none sits at the top of ``tests/``;
- the helper folders (``support``, ``peer``, ``data``) hold no tests, and
  the top of ``tests/`` holds only ``TOP_LEVEL`` modules;
- every folder of Python files under ``tests/`` is a package whose
  ``__init__.py`` has a docstring saying what it guards or provides;
- no module name under ``tests/`` has a word from ``WORK_ITEM_WORDS`` (the
  names of how a test came about) or ``VAGUE_WORDS`` (names of no content).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

# folders under tests/ that are not package paths, and why each may hold tests
NON_PACKAGE = {
    "project": "house-wide checks: layout, import layers, project text, docs, README walkthrough, this tree",
    "refusals": "bad input refused in one line with exit 2, grouped by what is refused, across packages",
}
# folders under tests/ that hold helpers or data and no tests
HELPERS = {
    "support": "helpers several test folders share (clean refusal, fuzz corruptors and runners, fake peers)",
    "peer": "the peer suite's vLLM side: scenarios, recorded fixtures and their generator",
    "data": "committed fixtures (recordings, a vLLM /metrics answer)",
}
# modules allowed at the top of tests/: the package, pytest's shared fixtures, and the example plug-ins whose
# import paths (tests.plugin_router:LastInstance) the README and docs/how-to/plugins.md give users to type
TOP_LEVEL = {"__init__.py", "conftest.py", "plugin_router.py", "plugin_router_views.py"}

# a word of a module name (split at "_") that says how or when a test was written, not what it checks
WORK_ITEM_WORDS = re.compile(
    r"adversarial|hostile|defects?|audits?|gaps?|leftovers?|r\d+|stops?\d*|rounds?\d*|waves?\d*|campaigns?"
    r"|fix(es|ed)?\d*|followups?|issues?\d*|bugs?\d*|sprints?\d*|reviews?|regressions?|todo|wip|tmp|new|old")
# a word that names no content at all
VAGUE_WORDS = re.compile(r"utils?|common|misc|helpers?|stuff|various|other")
SKIP_DIRS = {"__pycache__", "fixtures"}


def _words(stem: str) -> list[str]:
    return [w for w in stem.lower().split("_") if w]


def layout_problems(tests: Path, repo: Path) -> list[str]:
    """Every breach of the rules in the tree at ``tests`` (a tests/ folder) of the project at ``repo``."""
    problems = []
    for path in sorted(tests.rglob("*.py")):
        rel = path.relative_to(tests)
        if SKIP_DIRS & set(rel.parts):
            continue
        folder = rel.parts[:-1]
        bad = [w for w in _words(path.stem) if WORK_ITEM_WORDS.fullmatch(w) or VAGUE_WORDS.fullmatch(w)]
        if bad:
            problems.append(f"{rel}: its name says how it came about or nothing ({', '.join(bad)}), "
                            "not what it checks")
        if not folder:
            if path.name not in TOP_LEVEL:
                problems.append(f"{rel}: at the top of tests/; it belongs in the folder of what it guards")
            continue
        if not path.name.startswith("test_"):
            continue
        if folder[0] in HELPERS:
            problems.append(f"{rel}: a test in a helper folder ({folder[0]}: {HELPERS[folder[0]]})")
        elif folder[0] not in NON_PACKAGE and not (repo.joinpath(*folder) / "__init__.py").is_file():
            problems.append(f"{rel}: {'/'.join(folder)}/ is not a package of the project")
    for init_dir in sorted({p.parent for p in tests.rglob("*.py")}):
        rel = init_dir.relative_to(tests)
        if SKIP_DIRS & set(rel.parts):
            continue
        init = init_dir / "__init__.py"
        if not init.is_file():
            problems.append(f"{rel}/: Python files without an __init__.py")
        elif not ast.get_docstring(ast.parse(init.read_text())):
            problems.append(f"{rel}/__init__.py: no docstring saying what the folder guards or provides")
    return problems


def test_the_test_tree_mirrors_the_packages_and_names_say_what_they_check():
    problems = layout_problems(REPO / "tests", REPO)
    assert not problems, "\n".join(problems)


def _tree(tmp: Path, files: dict[str, str]) -> tuple[Path, Path]:
    repo = tmp / "repo"
    for rel, text in {"estimators/__init__.py": "", "estimators/engine/__init__.py": "", **files}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    return repo / "tests", repo


GOOD = {
    "tests/__init__.py": '"""The tests."""\n',
    "tests/conftest.py": "",
    "tests/estimators/__init__.py": '"""Tests of estimators/."""\n',
    "tests/estimators/engine/__init__.py": '"""Tests of estimators/engine/."""\n',
    "tests/estimators/engine/test_block_cache.py": "",
    "tests/refusals/__init__.py": '"""Bad input refused."""\n',
    "tests/refusals/test_bad_options.py": "",
    "tests/support/__init__.py": '"""Shared helpers."""\n',
    "tests/support/clean_refusal.py": "",
}


def test_a_tree_by_the_rules_has_no_problem(tmp_path):
    assert layout_problems(*_tree(tmp_path, GOOD)) == []


def test_each_breach_is_named(tmp_path):
    bad = {
        **GOOD,
        "tests/test_loose.py": "",  # at the top
        "tests/estimators/engine/test_hostile_engine.py": "",  # a campaign's name
        "tests/refusals/test_r12_options.py": "",  # a work round's
        "tests/estimators/engine/test_audit_gaps.py": "",
        "tests/support/fuzz_utils.py": "",  # a name of no content
        "tests/estimatorz/__init__.py": '"""Typo."""\n',
        "tests/estimatorz/test_sfs.py": "",  # not a package of the project
        "tests/support/test_inside_helpers.py": "",  # a test among helpers
        "tests/estimators/sfs/test_sfs_exact.py": "",  # no __init__.py (and estimators/sfs is no package here)
        "tests/estimators/learned/__init__.py": "",  # no docstring
        "tests/estimators/learned/test_forest.py": "",
    }
    got = "\n".join(layout_problems(*_tree(tmp_path, bad)))
    for needle in ("test_loose.py: at the top", "test_hostile_engine.py: its name", "(hostile)",
                   "test_r12_options.py: its name", "(r12)", "(audit, gaps)", "fuzz_utils.py: its name",
                   "estimatorz/ is not a package", "test_inside_helpers.py: a test in a helper folder",
                   "estimators/sfs/: Python files without an __init__.py", "estimators/sfs/ is not a package",
                   "estimators/learned/__init__.py: no docstring",
                   "learned/ is not a package"):
        assert needle in got, (needle, got)
    assert "test_block_cache" not in got and "test_bad_options" not in got and "clean_refusal" not in got
