"""What a production router sees (docs/concepts/estimators.md): engine state published
every ``interval_s`` (the state at the last publication boundary, as a
scheduler snapshot would carry it) and, with ``ledger`` on, the requests the
router has dispatched since that boundary, added to each stale view as
arrivals not yet taken in (the router knows what it sent, not what the
engine did with it).

interval 0 means no staleness: routers read each instance's live
``HonestView`` (``harness.twin.views.honest``), and the twin never builds
these views. A published view is a copy and carries no more truth than a
live one: its residents' targets are the predicted lengths routers were
told (0 without), and it keeps no reference to its instance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from estimators.engine.layout import F_RID, F_TARGET, S_NFREE_SLOTS, ST_PENDING
from estimators.engine.state import StepPlan
from estimators.snapshot import Snapshot


@dataclass
class ViewConfig:
    interval_ms: float = 0.0  # 0: every step (live state)
    ledger: bool = True

    @property
    def stale(self) -> bool:
        return self.interval_ms > 0.0

    def record(self) -> dict:
        return {"view_interval_ms": self.interval_ms, "ledger": self.ledger}


class StaleView(Snapshot):
    """A published snapshot (own copies of the arrays), plus the ledger."""

    def inbox_slots(self) -> np.ndarray:
        return self.inbox[: self.n_inbox]


def publish(inst, t: float) -> StaleView:
    """Copy of ``inst``'s honest view at time ``t``."""
    n_in = inst.n_inbox
    inbox = np.zeros(max(inst.inbox.size, 8), dtype=np.int64)
    inbox[:n_in] = inst.inbox[:n_in]
    st = inst.state.copy()
    st.req[:, F_TARGET] = 0 if inst.predicted is None else inst.predicted[st.req[:, F_RID]]
    return StaleView(t, inst.instance_id, st, inbox, n_in, StepPlan(*(a.copy() for a in inst.plan)),
                     inst.infl_n, inst.infl_start, inst.arrival_rate, inst.wake_s)


class StaleViews:
    """Per instance, the last published view; the twin calls ``refresh``
    before advancing instances to an arrival and ``dispatched`` after
    routing it."""

    def __init__(self, cfg: ViewConfig):
        self.interval = cfg.interval_ms / 1e3
        self.ledger = cfg.ledger
        self.views: list[StaleView] | None = None
        self.boundary = -math.inf
        self.refreshes = 0
        self.predicted: np.ndarray | None = None  # the lengths routers were told (the ledger's targets)

    def refresh(self, t: float, insts, out, advance_to=None) -> None:
        """If a publication boundary passed since the last one, advance
        every instance to the latest boundary <= t and publish there.
        ``advance_to(b, out)``: the twin's event queue
        (``harness.twin.event_queue``), which advances only the instances
        with work before ``b``; without it each instance is asked."""
        b = math.floor(t / self.interval) * self.interval
        if b <= self.boundary and self.views is not None:
            return
        if advance_to is not None:
            advance_to(b, out)
        else:
            for inst in insts:
                inst.advance(b, out)
        self.views = [publish(inst, b) for inst in insts]
        self.predicted = insts[0].predicted if insts else None
        self.boundary = b
        self.refreshes += 1

    def dispatched(self, j: int, rid: int, prompt: int) -> None:
        """The router sent ``rid`` to ``j``: with the ledger, the stale view
        shows it as an arrival not yet taken in."""
        self.dispatched_many(j, rid, prompt, 1)

    def dispatched_many(self, j: int, rid: int, prompt: int, n: int) -> None:
        """``n`` arrivals of ``rid`` at ``j`` not yet taken in (the stand-ins
        for requests another client sent, ``harness.route.metrics_view``), in
        one call: the state and the inbox grow at most once. The caller
        bounds ``n`` (each arrival is a slot every decision reads)."""
        if not self.ledger or n <= 0:
            return
        v = self.views[j]
        st = v.state
        need = st.capacity - int(st.sc[S_NFREE_SLOTS]) + n
        if need > st.capacity:
            st = st.grown(max(need, 2 * st.capacity))
            v.state = st
            v.inflight = v.inflight.grown(st.capacity)
        target = 1 if self.predicted is None else int(self.predicted[rid])
        if v.n_inbox + n > v.inbox.size:
            inbox = np.zeros(max(v.n_inbox + n, 2 * v.inbox.size), dtype=np.int64)
            inbox[: v.n_inbox] = v.inbox[: v.n_inbox]
            v.inbox = inbox
        for k in range(n):
            v.inbox[v.n_inbox + k] = st.add(rid, prompt, target, status=ST_PENDING)
        v.n_inbox += n
