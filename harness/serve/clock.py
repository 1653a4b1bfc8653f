"""Twin time against the wall clock: twin seconds run ``speed`` times
faster than wall seconds (``--speed K``), from one origin shared by every
instance of the served pool, so their step ends and arrivals share a
timeline as in the offline twin."""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Clock:
    speed: float = 1.0
    origin: float = field(default_factory=time.monotonic)

    def now(self) -> float:
        """The twin's present (seconds since the server started)."""
        return (time.monotonic() - self.origin) * self.speed

    def wall(self, t: float) -> float:
        """The monotonic wall time at which twin time ``t`` falls."""
        return self.origin + t / self.speed
