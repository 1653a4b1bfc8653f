"""A plug-in router that decides from what its views show (residents,
queued prompt tokens, the time): run isolated, each decision depends on
the views crossing the process boundary whole."""
from __future__ import annotations

from routers.base import Router


class LeastLoaded(Router):
    """the instance with the fewest residents, then the fewest prompt tokens of them; ties by the time"""

    summary = "fewest residents, then fewest resident prompt tokens"

    def choose(self, i: int, t: float, insts) -> int:
        def load(j: int):
            _, prompt, _, _ = insts[j].resident_progress()
            return insts[j].residents, int(prompt.sum()), (j + int(t * 1e3)) % len(insts)

        return min(range(len(insts)), key=load)
