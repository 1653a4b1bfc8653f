"""A request handed to an instance: into a free slot and the inbox
(``take_request``), and an idle engine woken (``wake``).

Why here, compiled: the fleet kernel hands requests over inside its
compiled call (``harness.twin.fleet_kernel.place_one``) and ``Instance``
from Python (a single instance, a fork, ``serve``, the per-instance
reference loop); both call these, so the stores are written once. They
take the few arrays they touch, not the bundles: a call from Python
unboxes every array it is handed.
"""
from __future__ import annotations

from numba import njit

from estimators.engine.layout import F_HIT, F_PROMPT, F_RID, F_STATUS, F_TARGET, S_NFREE_SLOTS, ST_PENDING
from harness.twin.loop.parts import GAP, IDLE, M_BUSY, M_INBOX_N, T_START


@njit(cache=True, inline="always")
def take_request(sc, free_slots, req, inbox, meta, rid, prompt, target, hit):
    """Request ``rid`` into a free slot (the caller checked there is one and
    that the prompt can reach the scheduler), pending in the inbox until
    the next schedule() takes it in (``parts.take_inbox``). Returns the slot."""
    sc[S_NFREE_SLOTS] -= 1
    slot = free_slots[sc[S_NFREE_SLOTS]]
    row = req[slot]
    row[:] = 0
    row[F_PROMPT], row[F_TARGET], row[F_RID], row[F_HIT] = prompt, max(1, target), rid, hit
    row[F_STATUS] = ST_PENDING
    inbox[meta[M_INBOX_N]] = slot
    meta[M_INBOX_N] += 1
    return slot


@njit(cache=True, inline="always")
def wake(meta, times, gap, t):
    """An arrival at ``t`` wakes an idle engine: it schedules after the gap."""
    if meta[M_BUSY] == IDLE:
        meta[M_BUSY] = GAP
        times[T_START] = t + gap
