"""The twin's event queue: each instance's next due event in a heap, so an
arrival advances only the instances that have work before it.

Why: ``Instance.advance(t)`` does nothing (but move "now", which is a clock
the pool shares) on an instance whose in-flight step ends after ``t``, whose
gap ends after ``t``, or that is idle (``Instance.due``). Calling it on every
instance at every arrival made the replay's per-arrival work grow with the
fleet; popping only the due ones from a heap gives exactly the same calls
that do anything, in the same per-instance order, so the results are the
same bytes. The queue also records which instances changed (advanced or
handed a request), so only their views need refreshing
(``harness.twin.fleet_views``).

Entries are ``(due, index)``; an entry is stale when the instance's due time
moved since it was pushed (``_due[index]`` differs) and is dropped when
popped. Plain ``heapq``: at hundreds of instances a pop is a few hundred
nanoseconds, small beside one kernel call.
"""
from __future__ import annotations

import heapq
import math

import numpy as np

from harness.twin.instance import Instance


class EventQueue:
    """Next due events of a pool's instances, and the set changed since
    ``take_changed``."""

    def __init__(self, insts: list[Instance], clock: np.ndarray):
        self.insts = insts
        self.clock = clock
        self._due = [math.nan] * len(insts)  # due time of each instance's live entry (NaN: none)
        self._heap: list[tuple[float, int]] = []
        self._changed: list[int] = []
        self._is_changed = bytearray(len(insts))
        for k in range(len(insts)):
            self.touched(k)

    def touched(self, k: int) -> None:
        """Instance ``k`` changed (advanced, handed a request, woken): re-queue
        its next event and mark its view for refreshing."""
        d = self.insts[k].due()
        if d != self._due[k]:
            self._due[k] = d
            if d < math.inf:
                heapq.heappush(self._heap, (d, k))
        if not self._is_changed[k]:
            self._is_changed[k] = 1
            self._changed.append(k)

    def advance_to(self, t: float, out) -> None:
        """Move the clock to ``t`` and run every instance's steps that end by
        ``t`` (``Instance.advance`` on the due instances, by index)."""
        self.clock[0] = t
        heap, due = self._heap, self._due
        if not heap or heap[0][0] > t:
            return
        ready = []
        while heap and heap[0][0] <= t:
            d, k = heapq.heappop(heap)
            if d == due[k]:
                due[k] = math.nan  # in hand: a duplicate entry is stale
                ready.append(k)
        ready.sort()
        insts = self.insts
        for k in ready:
            insts[k].advance(t, out)
            self.touched(k)

    def take_changed(self) -> list[int]:
        """The instances changed since the last call (each once, in the order
        they changed); the set starts empty again."""
        ch = self._changed
        if ch:
            self._changed = []
            flags = self._is_changed
            for k in ch:
                flags[k] = 0
        return ch
