"""The house's layout: the harness is all rooms, the data layer (traces) is
rooms beside a few modules, and each room says what lives there and what it
may import. (Module length is not a rule: a module
holds one concept, as long as that takes.)"""
from __future__ import annotations

import ast

from tests.conftest import REPO


def rooms_of(package: str) -> list:
    """The package's rooms, each checked to be a package whose docstring says what it may import."""
    rooms = [p for p in (REPO / package).iterdir() if p.is_dir() and p.name != "__pycache__"]
    for room in rooms:
        init = room / "__init__.py"
        assert init.is_file(), room
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc, f"{init}: the docstring says what the room may import"
    return rooms


def test_the_harness_is_rooms():
    loose = [p.name for p in (REPO / "harness").glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"harness modules outside a room: {loose}"
    assert len(rooms_of("harness")) >= 6


def test_the_data_layer_is_rooms_beside_a_few_modules():
    """A newcomer finds a concept by its room: at most 8 modules stay beside them (the error type, the
    store and the commands' own readers), and no room is a catch-all."""
    loose = sorted(p.name for p in (REPO / "traces").glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= 8, f"traces modules beside its rooms: {loose}"
    rooms = {p.name for p in rooms_of("traces")}
    assert len(rooms) >= 6, rooms
    catch_alls = rooms & {"misc", "util", "utils", "common", "core", "helpers"}
    assert not catch_alls, f"catch-all rooms in traces: {catch_alls}"
