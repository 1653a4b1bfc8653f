"""One reader task per backend (the ``metrics`` view's polls, the ``exact``
view's state feeds), started with the proxy's HTTP session and cancelled
when it stops."""
from __future__ import annotations

import asyncio


class BackendTasks:
    """Subclasses define ``backends`` and ``async _read(j)``."""

    tasks: list[asyncio.Task]
    session = None

    async def start(self, session) -> None:
        self.session = session
        self.tasks = [asyncio.create_task(self._read(j)) for j in range(len(self.backends))]

    async def stop(self) -> None:
        for task in getattr(self, "tasks", ()):
            task.cancel()
        await asyncio.gather(*getattr(self, "tasks", ()), return_exceptions=True)
