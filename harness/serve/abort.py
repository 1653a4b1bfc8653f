"""Taking a request out of the engine (a client that disconnected): vLLM's
``finish_requests(..., FINISHED_ABORTED)`` at the next step boundary, on the
engine's own mechanics (``estimators.engine.primitives``): out of
``running``, ``waiting`` or the inbox, its blocks released, its slot
recycled. No scheduling rule here: the kernel plans the next step with
what is left."""
from __future__ import annotations

from numba import njit

from estimators.engine.layout import F_RID, F_STATUS, ST_PENDING, ST_RUNNING, ST_WAITING
from estimators.engine.primitives import finish, running_remove, wait_remove


@njit(cache=True)
def abort_slot(st, inbox, meta, inbox_n_field, s, rid):
    """Abort request ``rid`` in slot ``s``; returns the status it had (0 if
    the slot no longer holds it: finished meanwhile, nothing to do)."""
    if st.req[s, F_RID] != rid:
        return 0
    status = st.req[s, F_STATUS]
    if status == ST_RUNNING:
        running_remove(st.sc, st.running, s)
    elif status == ST_WAITING:
        wait_remove(st.sc, st.waiting, s)
    elif status == ST_PENDING:
        w = 0
        for i in range(meta[inbox_n_field]):
            if inbox[i] != s:
                inbox[w] = inbox[i]
                w += 1
        meta[inbox_n_field] = w
    else:
        return 0
    finish(st, s)
    return status
