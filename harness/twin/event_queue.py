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
from numba import typeof
from numba.typed import List

from estimators.engine.fastcall import entry_point
from harness.twin.fleet_kernel import advance_due, append_item, new_list, set_item, sync_views
from harness.twin.instance import Instance


class EventQueue:
    """Next due events of a pool's instances, and the set changed since
    ``take_changed``."""

    def __init__(self, insts: list[Instance], clock: np.ndarray, batch: bool = True):
        """``batch``: advance the due instances in one compiled call
        (``harness.twin.fleet_kernel``); False, or bundles Numba cannot
        hold in one typed list, calls each instance's ``advance``."""
        self.insts = insts
        self.clock = clock
        self._bundles = _bundles(insts) if batch and len(insts) > 1 else None
        self._bundle_of = [(inst.state, inst.tw) for inst in insts]
        self._ks = np.zeros(len(insts), dtype=np.int64)
        self._full = np.zeros(len(insts), dtype=np.int64)
        self._dues = np.zeros(len(insts), dtype=np.float64)
        self._run = None  # advance_due's compiled entry, for these bundles' types
        self._sync = None  # sync_views' compiled entry
        self._shadows = None  # each view's request table (Instance._shadow), for sync_views
        self._rows = np.zeros(len(insts), dtype=np.int64)  # each instance's slots ever used (Instance.rows_used)
        self._due = [math.nan] * len(insts)  # due time of each instance's live entry (NaN: none)
        self._heap: list[tuple[float, int]] = []
        self._changed: list[int] = []
        self._is_changed = bytearray(len(insts))
        for k in range(len(insts)):
            self.touched(k)

    def touched(self, k: int) -> None:
        """Instance ``k`` changed (advanced, handed a request, woken): re-queue
        its next event and mark its view for refreshing."""
        inst = self.insts[k]
        if self._bundles is not None:
            st, tw = self._bundle_of[k]
            if inst.state is not st or inst.tw is not tw:  # it grew: new arrays
                set_item(self._bundles, k, _bundle(inst))
                self._bundle_of[k] = (inst.state, inst.tw)
        self._rows[k] = inst.rows_used
        d = inst.due()
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
        if self._bundles is None or len(ready) == 1:
            for k in ready:
                insts[k].advance(t, out)
                self.touched(k)
            return
        ks, full, dues, n = self._ks, self._full, self._dues, len(ready)
        ks[:n] = ready
        if self._run is None:
            self._run = _entry(t, ks, n, self._bundles, out, full, dues)
        self._run(t, ks, n, self._bundles, out, full, dues)
        flags, changed, heap = self._is_changed, self._changed, self._heap
        for k, f, d in zip(ready, full[:n].tolist(), dues[:n].tolist(), strict=True):
            if f:  # its step log filled: flush and carry on, as Instance.advance does
                insts[k].flush_log()
                insts[k].advance(t, out)
                d = insts[k].due()
            due[k] = d
            if d < math.inf:
                heapq.heappush(heap, (d, k))
            if not flags[k]:
                flags[k] = 1
                changed.append(k)

    def refresh_views(self, fleet) -> None:
        """Bring the views of the instances changed since the last call to
        the present (``FleetViews``): one compiled call for those whose view
        already holds the instance's arrays, ``Instance.sync_view`` for the
        rest (a first sync, or an instance that grew)."""
        changed = self.take_changed()
        if not changed:
            return
        if self._bundles is None:
            fleet.refresh(self.insts, changed)
            return
        insts, ks, n = self.insts, self._ks, 0
        for k in changed:
            inst = insts[k]
            if inst._view_of is inst.state:
                ks[n] = k
                n += 1
            else:
                fleet.refresh(insts, (k,))
                self._set_shadow(k, inst._shadow)
        if n:
            pred = insts[0].predicted
            args = (ks, n, self._bundles, self._shadows, self._rows, fleet.h, fleet.residents, _NONE if pred is None else pred)
            if self._sync is None:
                self._sync = entry_point(sync_views, *args)
            self._sync(*args)

    def _set_shadow(self, k: int, shadow: np.ndarray) -> None:
        if self._shadows is None:
            self._shadows = new_list(shadow)
            for _ in range(len(self.insts) - 1):
                append_item(self._shadows, shadow)  # placeholders until each view's first sync
        else:
            set_item(self._shadows, k, shadow)

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


_NONE = np.zeros(0, dtype=np.int64)  # no predicted lengths: the views' targets are 0
_ENTRIES: dict = {}


def _entry(*args):
    """``advance_due``'s compiled entry for these argument types (one per
    process and type: typing a list of bundles costs more than a call)."""
    key = tuple(typeof(a) for a in args)
    if key not in _ENTRIES:
        _ENTRIES[key] = entry_point(advance_due, *args)
    return _ENTRIES[key]


def _bundle(inst: Instance) -> tuple:
    return (inst.state, inst.plan, inst.tw, inst.model, inst.log)


def _bundles(insts: list[Instance]) -> List | None:
    """The instances' bundles in one typed list, or None when their types
    differ (e.g. prefix caching on some only): then each is called alone."""
    try:
        bl = new_list(_bundle(insts[0]))
        for inst in insts[1:]:
            append_item(bl, _bundle(inst))
        return bl
    except Exception:  # noqa: BLE001 (Numba's typing errors have no common public base)
        return None
