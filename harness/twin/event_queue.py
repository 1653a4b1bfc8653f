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
(``harness.twin.views.fleet``).

The heap, the due times and the changed set are plain arrays worked by
``harness.twin.fleet_kernel``, which also runs the due instances' steps in
the same compiled call when their bundles fit one typed list (one call per
arrival instead of one per due instance: a call from Python unboxes some
fifty arrays, longer than a step or two). Entries are ``(due, index)``; an
entry is stale when the instance's due time moved since it was pushed, and
is dropped when popped.
"""
from __future__ import annotations

import sys
from time import perf_counter_ns

import numpy as np
from numba import typeof
from numba.core.errors import NumbaError
from numba.typed import List

from estimators.engine.fastcall import entry_point
from estimators.engine.layout import S_NFREE_SLOTS
from harness.twin.fleet_kernel import (
    EAGER,
    LAZY,
    ON_READ,
    advance_queued,
    append_item,
    bring_one,
    heap_push,
    new_list,
    place_one,
    pop_due,
    set_item,
    sync_views,
)
from harness.twin.instance import Instance

_NONE = np.zeros(0, dtype=np.int64)  # no predicted lengths: the views' targets are 0


class EventQueue:
    """Next due events of a pool's instances, and the set changed since
    ``take_changed``."""

    def __init__(self, insts: list[Instance], clock: np.ndarray, batch: bool = True, lazy: bool = False):
        """``batch``: advance the due instances in one compiled call; False,
        or bundles Numba cannot hold in one typed list, calls each
        instance's ``advance``. ``lazy``: an instance in a steady run is
        next due when the run ends (``kernel.run_horizon``), not at each
        step's end: only for a router that reads nothing but the resident
        counts, and a loop that calls ``catch_up`` before handing an
        instance a request (with ``batch``; otherwise every step is due)."""
        n = len(insts)
        self.insts = insts
        self.clock = clock
        self._bundles = _bundles(insts) if batch and n > 1 else None
        self._bundle_of = [(inst.state, inst.tw) for inst in insts]
        self._ks = np.zeros(n, dtype=np.int64)
        self._full = np.zeros(n, dtype=np.int64)
        self._ht = np.zeros(2 * n + 2, dtype=np.float64)  # the heap: times and instance indices
        self._hk = np.zeros(2 * n + 2, dtype=np.int64)
        self._hn = np.zeros(1, dtype=np.int64)
        self._due = np.full(n, np.nan)  # due time of each instance's live entry (NaN: none)
        self._flag = np.zeros(n, dtype=np.uint8)  # changed since take_changed
        self._changed = np.zeros(2 * n + 2, dtype=np.int64)  # (bring: up to n + 1 entries between two forgets)
        self._nch = np.zeros(1, dtype=np.int64)
        self._entries: dict = {}  # each fleet kernel's compiled entry, for these bundles' types (``_call``)
        self.residents = np.zeros(n, dtype=np.int64)  # each instance's residents as of its last change
        self.lazy = np.int64(LAZY if lazy and self._bundles is not None else EAGER)
        self._edue = np.full(n, np.inf)  # each instance's next event (Instance.due), whatever it is queued at
        self._shadows = None  # each view's request table (Instance._shadow), for sync_views
        self._rows = np.zeros(n, dtype=np.int64)  # each instance's slots ever used (Instance.rows_used)
        self.brought_ns = 0  # time in ``bring`` since the caller last took it (``lend``)
        for k in range(n):
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
        self.residents[k] = inst.residents
        d = self._edue[k] = inst.due()
        if not d == self._due[k]:
            self._due[k] = d
            if d < np.inf:
                heap_push(self._ht, self._hk, self._hn, self._due, d, k)
        if not self._flag[k]:
            self._flag[k] = 1
            self._changed[self._nch[0]] = k
            self._nch[0] += 1

    def advance_to(self, t: float, out) -> None:
        """Move the clock to ``t`` and run every instance's steps that end by
        ``t`` (``Instance.advance`` on the due instances, by index; ON_READ,
        ``lend``: only the clock)."""
        self.clock[0] = t
        if self.lazy == ON_READ or self._hn[0] == 0 or self._ht[0] > t:
            return
        insts, ks, full = self.insts, self._ks, self._full
        if self._bundles is None:
            for k in ks[:pop_due(t, self._ht, self._hk, self._hn, self._due, ks)].tolist():
                insts[k].advance(t, out)
                self.touched(k)
            return
        args = (t, self._ht, self._hk, self._hn, self._due, ks, full, self._bundles, out, self._flag, self._changed,
                self._nch, self.residents, self.lazy, self._edue)
        n = self._call(advance_queued, *args)
        if n < 0:  # a step log filled (``advance_queued``)
            n = -1 - n
            for q in np.flatnonzero(full[:n]).tolist():
                k = int(ks[q])  # its step log filled: flush and carry on, as Instance.advance does
                insts[k].flush_log()
                insts[k].advance(t, out)
                self.touched(k)

    def catch_up(self, k: int, t: float, out) -> None:
        """Run instance ``k``'s steps to ``t`` (lazy: its due time may be
        past ``t``, its state is a run's earlier step; the steps are the
        same whenever they are run). The caller calls ``touched(k)``."""
        if self.lazy and self._edue[k] <= t:
            self.insts[k].advance(t, out)

    def place(self, k: int, t: float, rid: int, prompt: int, target: int, hit: int, out) -> None:
        """Hand instance ``k`` a request at ``t`` (the clock's present):
        ``catch_up``, ``Instance.add``, ``Instance.kick`` and ``touched``, in
        one compiled call (``place_one``) where the instance has a free slot
        and the bundles are batched, else those four in Python."""
        inst = self.insts[k]
        if self._bundles is not None and prompt >= 0 and inst.state.sc[S_NFREE_SLOTS] > 0:
            args = (t, k, rid, prompt, target, hit, self._bundles, out, self._ht, self._hk, self._hn, self._due,
                    self._edue, self._flag, self._changed, self._nch, self.residents, self.lazy)
            slot = self._call(place_one, *args)
            if slot >= 0:
                if slot >= inst.rows_used:
                    inst.rows_used = slot + 1
                self._rows[k] = inst.rows_used
                inst.rate.observe(inst._now)  # (Instance.add's)
                return
            inst.flush_log()  # its step log filled while catching up: flush, then as below
        self.catch_up(k, t, out)
        inst.add(rid, prompt, target, hit)
        if inst.idle:
            inst.kick(t)
        self.touched(k)

    def refresh_views(self, fleet) -> None:
        """Bring the views of the instances changed since the last call to
        the present (``FleetViews``, ``_refresh``)."""
        changed = self.take_changed()
        if changed:
            self._refresh(changed, fleet)

    def _refresh(self, changed, fleet) -> None:
        """The views of instances ``changed`` brought to the present: one
        compiled call for those whose view already holds the instance's
        arrays, ``Instance.sync_view`` for the rest (a first sync, or an
        instance that grew)."""
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
            args = (ks, n, self._bundles, self._shadows, self._rows, fleet.h, fleet.residents,
                    _NONE if pred is None else pred)
            self._call(sync_views, *args)

    def bring(self, k: int, out, fleet) -> None:
        """Instance ``k`` and its view at the present (``clock[0]``), for a
        router that reads views one at a time (``IndexedFleetViews``): its
        steps to now run if it was left in a steady run (lazy), and its
        view is refreshed if it changed since its last refresh. The view
        is then the one the eager loop would have shown: the same steps,
        run later (``catch_up``)."""
        if self.lazy:
            now, inst = self.clock[0], self.insts[k]
            sync = self._shadows is not None and inst._view_of is inst.state
            if self._edue[k] <= now or (sync and self._flag[k]):  # (else a view to sync only in Python, below)
                pred = inst.predicted
                args = (now, k, self._bundles, out, self._ht, self._hk, self._hn, self._due, self._edue, self._flag,
                        self._changed, self._nch, self.residents, self._shadows, self._rows, fleet.h,
                        fleet.residents, _NONE if pred is None else pred, sync, self.lazy)
                if self._call(bring_one, *args):  # its step log filled: flush, carry on in Python (Instance.advance)
                    inst.flush_log()
                    inst.advance(now, out)
                    self.touched(k)
        if self._flag[k]:
            self._flag[k] = 0
            self._refresh((k,), fleet)

    def lend(self, fleet, out) -> None:
        """Hand ``fleet`` (an ``IndexedFleetViews``) its ``bring``: each view
        read is brought to the present, the time it takes added to
        ``brought_ns`` (the caller takes it out of the decision's time).
        A lazy queue then advances an instance only when its view is read
        or it is handed a request (``fleet_kernel.ON_READ``; ``advance_to``
        only moves the clock): nothing else in the loop reads an instance
        before that, and its steps are the same whenever they are run, so
        an instance nobody reads is not advanced at arrivals, nor is the
        end of its steady runs computed (an sfs-cc replay at 24 instances
        reads about one view per arrival)."""
        if self.lazy:
            self.lazy = np.int64(ON_READ)
        def bring(k: int) -> None:
            t0 = perf_counter_ns()
            self.bring(k, out, fleet)
            self.brought_ns += perf_counter_ns() - t0

        fleet.bring = bring

    def forget_changed(self, fleet=None) -> None:
        """Empty the list of changed instances, keeping their flags (with
        ``bring``, the flags alone say which views are stale; the list is
        then only bounded here). ``fleet``: unused (a refresh's signature)."""
        self._nch[0] = 0

    def refresh_residents(self, fleet) -> None:
        """Only ``fleet.residents`` of the instances changed since the last
        call, for a router that reads nothing else (``reads =
        "residents"``): its views' other fields wait for the run's end,
        where the twin refreshes every view (``Twin.run``). The counts were
        taken as the instances changed (``touched``, ``advance_queued``)."""
        m = int(self._nch[0])
        if m:
            ch = self._changed[:m]
            fleet.residents[ch] = self.residents[ch]
            self._flag[ch] = 0
            self._nch[0] = 0

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
        m = int(self._nch[0])
        if not m:
            return []
        ch = self._changed[:m].tolist()
        self._flag[ch] = 0
        self._nch[0] = 0
        return ch


    def _call(self, dispatcher, *args):
        """``dispatcher(*args)`` through its compiled entry (``_entry``), kept per queue."""
        f = self._entries.get(dispatcher)
        if f is None:
            f = self._entries[dispatcher] = _entry(dispatcher, *args)
        return f(*args)


_ENTRIES: dict = {}


def _entry(dispatcher, *args):
    """``dispatcher``'s compiled entry for these argument types (one per
    process and types: typing a list of bundles costs more than a call)."""
    key = (dispatcher, *(typeof(a) for a in args))
    if key not in _ENTRIES:
        _ENTRIES[key] = entry_point(dispatcher, *args)
    return _ENTRIES[key]


def _bundle(inst: Instance) -> tuple:
    return (inst.state, inst.plan, inst.tw, inst.model, inst.log)


_WARNED: list[str] = []  # the compiled loop's load failure, once per process (every replay of a sweep meets it)


def _bundles(insts: list[Instance]) -> List | None:
    """The instances' bundles in one typed list, or None when their types
    differ: then each is called alone.

    Any other failure also falls back to each instance alone (the same
    bytes, slower), but says so once on stderr: a Numba cache index
    written before a type's module moved fails to unpickle on every call
    (Numba reads all of an index's overloads, numba/numba#6018), and the
    fleet then ran per instance unseen, about 1.6x slower on sfs-cc."""
    try:
        bl = new_list(_bundle(insts[0]))
        for inst in insts[1:]:
            append_item(bl, _bundle(inst))
        return bl
    except NumbaError:  # the bundles' types differ (a typed list holds one type)
        return None
    except Exception as e:  # noqa: BLE001 (whatever it is, the per-instance loop gives the same results)
        if not _WARNED:
            _WARNED.append(f"{type(e).__name__}: {e}")
            print(f"warning: the fleet's compiled loop did not load ({_WARNED[0]}; a Numba cache written before "
                  f"a module moved?); each instance runs alone, slower, same results; clearing the Numba cache "
                  f"(NUMBA_CACHE_DIR, or __pycache__ beside the sources) recompiles it", file=sys.stderr)
        return None
