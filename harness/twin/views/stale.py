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

from estimators.engine.layout import F_RID, F_TARGET, ST_PENDING
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
        if not self.ledger:
            return
        v = self.views[j]
        st = v.state.with_room()
        if st is not v.state:
            v.state = st
            v.inflight = v.inflight.grown(st.capacity)
        slot = v.state.add(rid, prompt, 1 if self.predicted is None else int(self.predicted[rid]), status=ST_PENDING)
        if v.n_inbox >= v.inbox.size:
            v.inbox = np.concatenate([v.inbox, np.zeros(v.inbox.size, dtype=np.int64)])
        v.inbox[v.n_inbox] = slot
        v.n_inbox += 1
