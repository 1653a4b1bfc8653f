"""The moves every kernel makes on a ``SchedState``, in Numba, written once:
the waiting queue (a circular buffer: head ``sc[S_WHEAD]``, length
``sc[S_WN]``, capacity ``sc[S_CAP]``), KV blocks (a free count, or with
prefix caching vLLM's block pool: hits, allocation, registration, release),
admission, preemption (recompute), finishing and slot recycling (the KV-block
moves themselves are ``kv_blocks``). The scheduling *rules* live in ``kernel``;
these are the mechanics both it and the recorded-state walker use.
"""
from __future__ import annotations

from numba import njit

from estimators.engine.kv_blocks import release_blocks, take_blocks
from estimators.engine.layout import (
    C_ASYNC,
    C_SCHED_PRIORITY,
    F_ARRIVAL,
    F_BLOCKS,
    F_COMPUTED,
    F_NCACHED,
    F_PH,
    F_PREEMPTIONS,
    F_PRIO,
    F_RID,
    F_STATUS,
    S_CAP,
    S_FREE_BLOCKS,
    S_NFREE_SLOTS,
    S_NPREEMPT,
    S_NR,
    S_WHEAD,
    S_WN,
    ST_FINISHED,
    ST_RUNNING,
    ST_WAITING,
)


@njit(cache=True, inline="always")
def cdiv(a, b):
    return -(-a // b)


# --- the waiting queue

@njit(cache=True, inline="always")
def wait_head(sc, waiting):
    return waiting[sc[S_WHEAD]]


@njit(cache=True, inline="always")
def wait_pop_front(sc, waiting):
    s = waiting[sc[S_WHEAD]]
    sc[S_WHEAD] = (sc[S_WHEAD] + 1) % sc[S_CAP]
    sc[S_WN] -= 1
    return s


@njit(cache=True, inline="always")
def wait_push_front(sc, waiting, s):
    sc[S_WHEAD] = (sc[S_WHEAD] - 1 + sc[S_CAP]) % sc[S_CAP]
    waiting[sc[S_WHEAD]] = s
    sc[S_WN] += 1


@njit(cache=True, inline="always")
def wait_push_back(sc, waiting, s):
    waiting[(sc[S_WHEAD] + sc[S_WN]) % sc[S_CAP]] = s
    sc[S_WN] += 1


@njit(cache=True, inline="always")
def runs_before(req, a, b):
    """Priority scheduling: ``a`` is ahead of ``b`` in waiting, vLLM's
    ``Request.__lt__`` (priority, then arrival time, then request id)."""
    if req[a, F_PRIO] != req[b, F_PRIO]:
        return req[a, F_PRIO] < req[b, F_PRIO]
    if req[a, F_ARRIVAL] != req[b, F_ARRIVAL]:
        return req[a, F_ARRIVAL] < req[b, F_ARRIVAL]
    return req[a, F_RID] < req[b, F_RID]


@njit(cache=True)
def wait_insert(req, sc, waiting, s):
    """Priority scheduling: put ``s`` at its place in waiting, kept sorted
    by ``runs_before`` (vLLM's heap: its head, and the order it is popped in,
    are the sorted order; ``prepend_request`` is a push like any other)."""
    cap = sc[S_CAP]
    head = sc[S_WHEAD]
    j = sc[S_WN]
    while j > 0:
        x = waiting[(head + j - 1) % cap]
        if not runs_before(req, s, x):
            break
        waiting[(head + j) % cap] = x
        j -= 1
    waiting[(head + j) % cap] = s
    sc[S_WN] += 1


@njit(cache=True, inline="always")
def wait_enqueue(cfg, req, sc, waiting, s):
    """A request joins waiting (``add_request``): at the back (FCFS), or at
    its place by priority."""
    if cfg[C_SCHED_PRIORITY] != 0:
        wait_insert(req, sc, waiting, s)
    else:
        wait_push_back(sc, waiting, s)


@njit(cache=True, inline="always")
def wait_remove(sc, waiting, s):
    """Take ``s`` out of the queue wherever it is (order of the rest kept)."""
    cap = sc[S_CAP]
    head = sc[S_WHEAD]
    if waiting[head] == s:  # the usual case: admission from the head
        wait_pop_front(sc, waiting)
        return
    w = 0
    for r in range(sc[S_WN]):
        x = waiting[(head + r) % cap]
        if x != s:
            waiting[(head + w) % cap] = x
            w += 1
    sc[S_WN] = w


@njit(cache=True)
def wait_linear(sc, waiting, dst):
    """Copy the queue, head first, into ``dst[:sc[S_WN]]``."""
    cap = sc[S_CAP]
    for i in range(sc[S_WN]):
        dst[i] = waiting[(sc[S_WHEAD] + i) % cap]


# --- running, admission, preemption, finishing

@njit(cache=True, inline="always")
def running_remove(sc, running, s):
    w = 0
    for r in range(sc[S_NR]):
        if running[r] != s:
            running[w] = running[r]
            w += 1
    sc[S_NR] = w


@njit(cache=True, inline="always")
def admit_uncached(req, sc, running, waiting, blocks, computed):
    """``admit`` with prefix caching off, on the arrays (hot paths: an
    inlined helper taking ``st`` copies the whole tuple, a reference-count
    increment and decrement per array)."""
    s = wait_pop_front(sc, waiting)
    running[sc[S_NR]] = s
    sc[S_NR] += 1
    req[s, F_STATUS] = ST_RUNNING
    req[s, F_COMPUTED] = computed
    sc[S_FREE_BLOCKS] -= blocks
    req[s, F_BLOCKS] = blocks
    return s


@njit(cache=True, inline="always")
def admit(st, hit_blocks, blocks, computed):
    """Pop the head of ``waiting`` into the tail of ``running`` with
    ``blocks`` KV blocks (the first ``hit_blocks`` from the prefix cache)
    and ``computed`` tokens already computed."""
    req, sc = st.req, st.sc
    s = wait_pop_front(sc, st.waiting)
    st.running[sc[S_NR]] = s
    sc[S_NR] += 1
    req[s, F_STATUS] = ST_RUNNING
    req[s, F_COMPUTED] = computed
    take_blocks(st, s, hit_blocks, blocks)
    return s


@njit(cache=True, inline="always")
def preempt(st, s):
    """Recompute preemption of running request ``s``: its blocks are freed,
    its computed tokens reset and it goes to the front of ``waiting`` (under
    priority scheduling, to its place in it)."""
    req, sc = st.req, st.sc
    if sc[S_NR] > 0 and st.running[sc[S_NR] - 1] == s:
        sc[S_NR] -= 1  # the usual case: the tail of running
    else:
        running_remove(sc, st.running, s)
    release_blocks(st, s)
    req[s, F_COMPUTED] = 0
    req[s, F_STATUS] = ST_WAITING
    req[s, F_PREEMPTIONS] += 1
    if st.cfg[C_ASYNC] != 0:
        req[s, F_PH] = 0  # async scheduling: the outputs in flight are stale (no F_PH column in sync mode)
    if st.cfg[C_SCHED_PRIORITY] != 0:
        wait_insert(req, sc, st.waiting, s)  # vLLM's prepend_request on a priority queue: a heap push
    else:
        wait_push_front(sc, st.waiting, s)
    sc[S_NPREEMPT] += 1


@njit(cache=True, inline="always")
def release_slot(st, s):
    st.free_slots[st.sc[S_NFREE_SLOTS]] = s
    st.sc[S_NFREE_SLOTS] += 1


@njit(cache=True, inline="always")
def finish(st, s):
    """``s`` is done: its blocks and slot are freed (its row stays readable
    until the slot is reused); the caller compacts ``running``."""
    st.req[s, F_STATUS] = ST_FINISHED
    release_blocks(st, s)
    release_slot(st, s)


@njit(cache=True, inline="always")
def finished_slot(req, sc, free_slots, s):
    """``s`` is done and its blocks released: mark it and recycle its slot."""
    req[s, F_STATUS] = ST_FINISHED
    free_slots[sc[S_NFREE_SLOTS]] = s
    sc[S_NFREE_SLOTS] += 1


@njit(cache=True, inline="always")
def finish_uncached(req, sc, free_slots, s):
    """``finish`` with prefix caching off, on the arrays (hot loops: an
    inlined helper taking ``st`` copies the whole tuple, a reference-count
    increment and decrement per array)."""
    sc[S_FREE_BLOCKS] += req[s, F_BLOCKS]
    req[s, F_BLOCKS] = 0
    req[s, F_NCACHED] = 0
    finished_slot(req, sc, free_slots, s)


@njit(cache=True, inline="always")
def compact_running(req, sc, running):
    """Drop requests that are no longer RUNNING from ``running`` (order kept)."""
    w = 0
    for r in range(sc[S_NR]):
        s = running[r]
        if req[s, F_STATUS] == ST_RUNNING:
            running[w] = s
            w += 1
    sc[S_NR] = w
