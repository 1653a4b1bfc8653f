"""Advance several due instances in one compiled call.

Why: a call into ``harness.twin.kernel.advance`` from Python unboxes some
fifty arrays (the instance's bundles), about as long as a few simulated
steps; at hundreds of instances an arrival finds dozens due, each with a
step or two to run, so the calls, not the steps, were the cost. The event
queue keeps each instance's bundles in a Numba typed list once (re-set
only when an instance grows) and hands this loop the due ones' indices.
It calls the same ``advance`` in the same order on the same arrays as one
call per instance would: the results are the same bytes.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from estimators.engine.layout import S_NR, S_WN
from harness.twin import kernel as tk
from harness.twin.honest_view import copy_predicted, honest_scalars


@njit(cache=True)
def advance_due(t, ks, n, bundles, out, full, dues):
    """``advance(t)`` on instances ``ks[:n]`` (their bundles: (state, plan,
    twin arrays, time model, log)); ``full[q]`` = 1 where the step log
    filled (the caller flushes it and carries on with that instance), else
    ``dues[q]`` is the instance's next due time (``Instance.due``)."""
    for q in range(n):
        st, plan, tw, model, log = bundles[ks[q]]
        full[q] = tk.advance(t, st, plan, tw, model, out, log)
        busy = tw.meta[tk.M_BUSY]
        if busy == tk.RUNNING:
            dues[q] = tw.times[tk.T_END]
        elif busy == tk.GAP:
            dues[q] = tw.times[tk.T_START]
        else:
            dues[q] = np.inf


@njit(cache=True)
def sync_views(ks, n, bundles, shadows, rows, hs, residents, predicted):
    """Refresh the views of instances ``ks[:n]``: the request table copied
    into the view's own (``shadows[k]``) with the predicted lengths as
    targets (its first ``rows[k]`` rows: the slots ever used), the honest scalars into ``hs[k]`` and the resident count into
    ``residents[k]`` (``Instance.sync_view``'s work, for views whose
    arrays are already the instance's present ones)."""
    for q in range(n):
        k = ks[q]
        st, plan, tw, model, log = bundles[k]
        copy_predicted(shadows[k], st.req, predicted, rows[k])
        honest_scalars(hs[k], tw.meta, tw.times, tw.speed, model.gap)
        residents[k] = st.sc[S_NR] + st.sc[S_WN] + tw.meta[tk.M_INBOX_N]


@njit(cache=True)
def new_list(first):
    """A typed list holding ``first`` (built in compiled, cached code: the
    typed list's own Python methods compile again in every process)."""
    bl = List()
    bl.append(first)
    return bl


@njit(cache=True)
def append_item(bl, b):
    bl.append(b)


@njit(cache=True)
def set_item(bl, k, b):
    bl[k] = b
