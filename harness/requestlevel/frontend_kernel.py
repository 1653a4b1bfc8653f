"""The two-phase front-end server's loop (``harness.requestlevel.frontend.two_phase_done``),
compiled: calibration replays it hundreds of times per trace, over every
engine step's deliveries.

Both queues it serves are already in key order: handlings are released in
arrival order (accepts are taken in arrival order) and keyed by arrival,
and output jobs are sorted by time, so the ready queue is a merge of two
sorted queues, not a heap.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def two_phase_loop(arrival: np.ndarray, accept_s: float, handle_s: float, out_t: np.ndarray,
                   out_cost: np.ndarray, done_h: np.ndarray, done_o: np.ndarray) -> None:
    """``arrival`` and ``out_t`` sorted; writes each handling's and each
    output job's completion into ``done_h`` / ``done_o``."""
    n, m = arrival.size, out_t.size
    t = -np.inf
    ia = 0  # next request to accept
    ih = 0  # next handling to serve (accepted: ih < ia)
    io = 0  # next output job to serve (arrived: out_t[io] <= t)
    left = n + m
    while left > 0:
        if ia < n and arrival[ia] <= t:  # an accept is waiting: it goes first
            t += accept_s
            ia += 1
            continue
        h_ready = ih < ia
        o_ready = io < m and out_t[io] <= t
        if h_ready and (not o_ready or arrival[ih] <= out_t[io]):
            t += handle_s
            done_h[ih] = t
            ih += 1
            left -= 1
        elif o_ready:
            t += out_cost[io]
            done_o[io] = t
            io += 1
            left -= 1
        else:  # idle until the next arrival
            nxt = np.inf
            if ia < n:
                nxt = arrival[ia]
            if io < m and out_t[io] < nxt:
                nxt = out_t[io]
            t = nxt
