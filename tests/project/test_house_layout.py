"""The house's layout: the harness is all rooms, and each room says what
lives there and what it may import. (Module length is not a rule: a module
holds one concept, as long as that takes.)"""
from __future__ import annotations

import ast

from tests.conftest import REPO


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
