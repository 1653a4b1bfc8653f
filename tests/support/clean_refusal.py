"""What every refusal case asserts: exit 2, exactly one line
on stderr starting ``error: `` (naming file/row/column where there is one),
no traceback, and nothing written or removed in the directories watched.

The refusal tests live in ``tests/refusals/`` (and beside the package a
refusal belongs to) and call ``refused_cleanly``;
``pytest --collect-only -q tests/refusals`` counts the cases.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from tests.conftest import run_cli


def tree_state(*roots: Path) -> dict[str, tuple]:
    """Every entry under ``roots``: kind, mode, size and a content hash for
    files (mtime is left out: a refused run must not change bytes, and
    reading does not change them)."""
    state: dict[str, tuple] = {}
    for root in roots:
        root = Path(root)
        if not os.path.lexists(root):
            state[str(root)] = ("absent",)
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            for name in [*dirnames, *filenames, ""]:
                p = Path(dirpath) / name if name else Path(dirpath)
                st = os.lstat(p)
                if stat.S_ISREG(st.st_mode):
                    digest = hashlib.sha1(p.read_bytes()).hexdigest()
                    state[str(p)] = ("file", st.st_mode, st.st_size, digest)
                else:
                    state[str(p)] = (stat.S_IFMT(st.st_mode), st.st_mode)
    return state


def refused_cleanly(args: list, watch: list[Path], *fragments: str):
    """Run ``latroute *args`` in process and assert a clean refusal: exit 2,
    one ``error: `` line containing every fragment, no traceback, and the
    watched directories byte-for-byte unchanged. Returns the error line."""
    before = tree_state(*watch)
    res = run_cli(*args)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code == 2, (args, res.exit_code, res.output[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, lines)
    assert "Traceback" not in res.output, (args, res.output[-2000:])
    for frag in fragments:
        assert frag in lines[0], (args, frag, lines[0])
    after = tree_state(*watch)
    changed = sorted(set(before.items()) ^ set(after.items()))
    assert not changed, (args, changed[:5])
    return lines[0]
