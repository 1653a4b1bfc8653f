"""A plug-in router for the tests and the README's example: always the
last instance (the pool's largest model)."""
from __future__ import annotations

from routers.base import Router


class LastInstance(Router):
    """always the last instance of the pool"""

    summary = "always the last instance"

    def choose(self, i: int, t: float, insts) -> int:
        return len(insts) - 1
