"""The project's text is about latroute, not about how it was made.

Code, docstrings, tests, the docs and the README say what latroute does,
why, and what was measured; how the work went (its rounds, its work-item
numbers, who ran what on which branch, what a session did) belongs in the
git log. And a reference must be one a user can open: a docs page, a
paper by its title, a vLLM file by its path and version; not a design note
that ships with no checkout. ``git grep`` finds each kind of diary phrase
below in every tracked text file; a hit fails unless an exemption below
names its file and line text, with the reason it is not a diary phrase.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# kind -> POSIX extended regex (git grep -E; \b is GNU's word boundary)
PATTERNS = {
    "a work-item number": r"\b[Ii]ssues? #?[0-9]+",
    "a work round": r"\b[Ss]tops? [0-9]+\b|\b[Rr]ound [0-9]+\b|\b[Ww]ave [0-9]+\b",
    "a work item": r"\b[Tt]he issue('s)?\b|\b[Tt]his issue\b|\bacceptance item|\bwork item",
    "a work session": r"\b([Tt]his|[Tt]hat|[Ll]ast|[Pp]revious|[Ee]arlier|[Nn]ext) session\b|\b[Tt]he session (ran|.s own)",
    "a worker": r"\b[A-Z]{3,} helper\b|\bidle helper\b|\bhelper.s branch|\bother engineers|\b[0-9]+ agents\b",
    "a branch": r"\bbranch `|\bfrom branch\b|\bon (this|my|the) branch\b",
    "the main branch as a baseline": r"\bmain at [0-9a-f]{7}|\bmain.s (code|routers|sfs-cc|one|loop|results)\b",
    "a file users do not get": r"\bDESIGN\b|\bCOMMON\b|\bSTYLE\.md\b|shared/reference/",
}
FILES = ["*.py", "*.md", "*.toml", "*.yml", "*.yaml", "*.cfg", "*.json", "*.tsv", "*.sh", "*.txt", "README*"]

# (path, text in the line, why it is not a diary phrase)
EXEMPT = [
    ("tests/test_project_text.py", "", "this test's own patterns and examples"),
]

# Files this test does not yet hold to the rule, each with its hits' count: they are
# rewritten where they are edited next. The count must fall (a new hit fails) and an
# entry whose hits are gone must be removed (it fails until it is).
PENDING = {
    "harness/route/inputs.py": 1,
    "traces/workload/sessions.py": 1,
}


def hits() -> dict[str, list[tuple[str, str]]]:
    """kind -> [(path:line, text)] of every line git grep finds, exemptions taken out."""
    found: dict[str, list[tuple[str, str]]] = {}
    for kind, pattern in PATTERNS.items():
        r = subprocess.run(["git", "grep", "-nIE", pattern, "--", *FILES], cwd=ROOT, capture_output=True,
                           text=True, check=False)
        assert r.returncode in (0, 1), r.stderr  # 1: no match
        for line in r.stdout.splitlines():
            path, num, text = line.split(":", 2)
            if any(path == p and t in text for p, t, _ in EXEMPT):
                continue
            found.setdefault(kind, []).append((f"{path}:{num}", text.strip()[:160]))
    return found


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs a git checkout")
def test_no_work_diary_in_the_project():
    per_file: dict[str, int] = {}
    loose = []
    for kind, rows in hits().items():
        for where, text in rows:
            path = where.rsplit(":", 1)[0]
            per_file[path] = per_file.get(path, 0) + 1
            if path not in PENDING:
                loose.append(f"{where}: {kind}: {text}")
    assert not loose, "diary phrases (say what latroute does, not how the work went):\n" + "\n".join(loose)
    grown = {p: (per_file.get(p, 0), n) for p, n in PENDING.items() if per_file.get(p, 0) != n}
    assert not grown, f"PENDING counts changed (hits now, listed): {grown}; lower or remove the entries"


def test_the_patterns_find_what_they_name():
    """Each pattern matches its diary phrase and leaves an ordinary sentence alone (GNU ERE, as git grep)."""
    diary = {
        "a work-item number": "the fleet loop (issue 26) changes nothing",
        "a work round": "### Stop 41: a lazy loop",
        "a work item": "Against the issue's targets",
        "a work session": "four earlier runs of the same command this session",
        "a worker": "from the ROUTERS helper's branch",
        "a branch": "from branch `fleet-routers`",
        "the main branch as a baseline": "main at 8d9f8d7, before the event queue",
        "a file users do not get": "DESIGN section 5",
    }
    plain = ["the prefix cache's stop token", "a multi-turn session workload", "the else branch of the loop",
             "a helper function", "vLLM's GitHub issues (https://github.com/vllm-project/vllm/issues/1)"]
    for kind, text in diary.items():
        assert _matches(PATTERNS[kind], text), kind
    for text in plain:
        assert not any(_matches(p, text) for p in PATTERNS.values()), text


def _matches(pattern: str, text: str) -> bool:
    """Python's re for the patterns (their ERE subset: \\b, classes, alternation, groups, '.')."""
    return re.search(pattern, text) is not None
