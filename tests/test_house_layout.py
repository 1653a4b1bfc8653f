"""The house's layout (issue 24): the harness is all rooms, each room says
what lives there and what it may import, and no module grows past 400 lines
unless its docstring says why it is one piece."""
from __future__ import annotations

import ast

from tests.conftest import REPO

PACKAGES = ("harness", "traces", "estimators", "routers", "reports", "tests", "docs")
MAX_LINES = 400


def _modules():
    for top in PACKAGES:
        yield from sorted((REPO / top).rglob("*.py"))


def test_the_harness_is_rooms():
    loose = [p.name for p in (REPO / "harness").glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"harness modules outside a room: {loose}"
    rooms = [p for p in (REPO / "harness").iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert len(rooms) >= 6
    for room in rooms:
        init = room / "__init__.py"
        assert init.is_file(), room
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc, f"{init}: the docstring says what the room may import"


def test_no_module_over_400_lines_unless_it_says_why():
    long = []
    for p in _modules():
        n = len(p.read_text().splitlines())
        if n > MAX_LINES:
            doc = ast.get_docstring(ast.parse(p.read_text())) or ""
            if "one piece" not in doc:
                long.append((p.relative_to(REPO).as_posix(), n))
    assert long == [], long
