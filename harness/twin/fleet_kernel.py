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

from numba import njit
from numba.typed import List

from harness.twin import kernel as tk


@njit(cache=True)
def advance_due(t, ks, n, bundles, out, full):
    """``advance(t)`` on instances ``ks[:n]`` (their bundles: (state, plan,
    twin arrays, time model, log)); ``full[q]`` = 1 where the step log
    filled (the caller flushes it and carries on with that instance)."""
    for q in range(n):
        st, plan, tw, model, log = bundles[ks[q]]
        full[q] = tk.advance(t, st, plan, tw, model, out, log)


@njit(cache=True)
def new_bundles(first):
    """A typed list holding ``first`` (compiled and cached here: the typed
    list's own Python methods compile on every process's first use)."""
    bl = List()
    bl.append(first)
    return bl


@njit(cache=True)
def append_bundle(bl, b):
    bl.append(b)


@njit(cache=True)
def set_bundle(bl, k, b):
    bl[k] = b
