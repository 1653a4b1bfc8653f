"""Taking a request out of the engine (a client that disconnected): vLLM's
``finish_requests(..., FINISHED_ABORTED)`` at the next step boundary, on the
engine's own mechanics (``estimators.engine.primitives``): out of
``running``, ``waiting`` or the inbox, its blocks released, its slot
recycled. No scheduling rule here: the kernel plans the next step with
what is left."""
from __future__ import annotations

import numpy as np
from numba import njit

from estimators.engine.layout import F_RID, F_STATUS, ST_PENDING, ST_RUNNING, ST_WAITING
from estimators.engine.primitives import finish, running_remove, wait_remove


@njit(cache=True)
def abort_slot(st, s, rid):
    """Abort request ``rid`` in slot ``s`` (out of the inbox already, if it
    was there: ``take_from_inbox``); returns the status it had (0 if the
    slot no longer holds it: finished meanwhile, nothing to do)."""
    if st.req[s, F_RID] != rid:
        return 0
    status = st.req[s, F_STATUS]
    if status == ST_RUNNING:
        running_remove(st.sc, st.running, s)
    elif status == ST_WAITING:
        wait_remove(st.sc, st.waiting, s)
    elif status != ST_PENDING:
        return 0
    finish(st, s)
    return status


def take_from_inbox(inbox: np.ndarray, meta: np.ndarray, n_field: int, s: int) -> None:
    """Slot ``s`` out of the inbox (arrived, not yet handed to schedule()),
    the others' order kept."""
    n = int(meta[n_field])
    box = inbox[:n]
    if s in box:
        keep = box[box != s]
        inbox[: keep.size] = keep
        meta[n_field] = keep.size
