"""Advance several due instances in one compiled call.

Why: a call into ``harness.twin.loop.kernel.advance`` from Python unboxes some
fifty arrays (the instance's bundles), about as long as a few simulated
steps; at hundreds of instances an arrival finds dozens due, each with a
step or two to run, so the calls, not the steps, were the cost. The event
queue keeps each instance's bundles in a Numba typed list once (re-set
only when an instance grows) and hands this loop the due ones' indices.
It calls the same ``advance`` in the same order on the same arrays as one
call per instance would: the results are the same bytes.

The work of ``advance_queued``, ``bring_one`` and ``place_one`` is
compiled without Numba's runtime (``_nrt=False``; their entries from
Python, which must unbox the typed list, only call it): the instance's
bundle is borrowed from the list (``harness.twin.loop.borrow``) and no array
is reference-counted in the steps they run (``kernel.advance`` is compiled
the same way). Taking each bundle with a reference, and every inner call
taking its arrays with one, was a seventh of an sfs-cc replay at 24
instances.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

from estimators.engine.layout import S_NR, S_WN
from harness.twin.loop import kernel as tk
from harness.twin.loop import parts as lp
from harness.twin.loop.borrow import borrow_item
from harness.twin.loop.hand_over import take_request, wake
from harness.twin.views.honest import copy_predicted, honest_scalars

# when the queue advances an instance (``EventQueue.lazy``): at each of its events (EAGER), at the end of the
# steady run in flight (LAZY: a router that reads only resident counts), or only when a router reads its view or
# it is handed a request (ON_READ: a router that reads views one at a time; nothing else needs it sooner)
EAGER, LAZY, ON_READ = 0, 1, 2


@njit(cache=True, inline="always")
def _residents(st, tw):
    """The instance's requests: running, waiting and not yet taken in."""
    return st.sc[S_NR] + st.sc[S_WN] + tw.meta[lp.M_INBOX_N]


@njit(cache=True, inline="always")
def _sync_borrowed(k, st, tw, model, shadow, rows, hs, residents, predicted):
    """A view's refresh: the instance's request table into the view's own
    (``shadow``) with the predicted lengths, its honest scalars and its
    resident count."""
    copy_predicted(shadow, st.req, predicted, rows[k])
    honest_scalars(hs[k], tw.meta, tw.times, tw.speed, model.gap)
    residents[k] = _residents(st, tw)


@njit(cache=True, inline="always")
def _sync_one(k, st, tw, model, shadows, rows, hs, residents, predicted):
    """``_sync_borrowed`` with the view's table taken from the list (code compiled with the runtime)."""
    _sync_borrowed(k, st, tw, model, shadows[k], rows, hs, residents, predicted)


@njit(cache=True, inline="always")
def _queue(k, d, ht, hk, hn, due, flag, changed, nch):
    """Instance ``k``'s next event queued at ``d`` (unless its live entry
    is there already) and ``k`` marked changed."""
    if not d == due[k]:
        due[k] = d
        if d < np.inf:
            heap_push(ht, hk, hn, due, d, k)
    _mark(k, flag, changed, nch)


@njit(cache=True, inline="always")
def _mark(k, flag, changed, nch):
    """Instance ``k`` marked changed (its view is stale)."""
    if not flag[k]:
        flag[k] = 1
        changed[nch[0]] = k
        nch[0] += 1


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
        _sync_one(k, st, tw, model, shadows, rows, hs, residents, predicted)


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


@njit(cache=True, inline="always")
def _sift_down(ht, hk, size, i):
    while True:
        c = 2 * i + 1
        if c >= size:
            return
        if c + 1 < size and ht[c + 1] < ht[c]:
            c += 1
        if ht[c] >= ht[i]:
            return
        _swap(ht, hk, i, c)
        i = c


@njit(cache=True, inline="always")
def _swap(ht, hk, i, j):
    ht[i], ht[j] = ht[j], ht[i]
    hk[i], hk[j] = hk[j], hk[i]


@njit(cache=True)
def heap_push(ht, hk, hn, due, d, k):
    """Queue instance ``k``'s next event at ``d`` (a binary min-heap over
    ``ht``/``hk``, ``hn[0]`` entries; rebuilt from ``due`` when full, which
    drops the stale entries: those whose time is no longer ``due[k]``)."""
    if hn[0] >= ht.size:
        m = 0
        for j in range(due.size):
            if due[j] < np.inf:
                ht[m], hk[m] = due[j], j
                m += 1
        hn[0] = m
        for i in range(m // 2 - 1, -1, -1):
            _sift_down(ht, hk, m, i)
        if d == due[k]:
            return  # it was just queued by the rebuild
    i = hn[0]
    hn[0] = i + 1
    ht[i], hk[i] = d, k
    while i > 0:
        p = (i - 1) // 2
        if ht[p] <= ht[i]:
            break
        _swap(ht, hk, i, p)
        i = p


@njit(cache=True)
def pop_due(t, ht, hk, hn, due, ks):
    """Pop the instances whose next event is at or before ``t`` into
    ``ks[:n]``, sorted (their ``due`` becomes NaN: in hand); returns n."""
    n = 0
    while hn[0] > 0 and ht[0] <= t:
        d, k = ht[0], hk[0]
        m = hn[0] - 1
        hn[0] = m
        ht[0], hk[0] = ht[m], hk[m]
        _sift_down(ht, hk, m, 0)
        if d == due[k]:
            due[k] = np.nan  # a duplicate entry is stale
            ks[n] = k
            n += 1
    # insertion sort, not ks[:n].sort(): numpy's sort compiled inside a caller built without Numba's
    # runtime fails to type (it depends on which caller compiled this first); n is the few instances due
    # at one moment, and the order is the same
    for i in range(1, n):
        k = ks[i]
        j = i - 1
        while j >= 0 and ks[j] > k:
            ks[j + 1] = ks[j]
            j -= 1
        ks[j + 1] = k
    return n


@njit(cache=True)
def advance_queued(t, ht, hk, hn, due, ks, full, bundles, out, flag, changed, nch, residents, lazy, edue):
    """``_advance_queued``, entered from Python (which unboxes the list)."""
    return _advance_queued(t, ht, hk, hn, due, ks, full, bundles, out, flag, changed, nch, residents, lazy, edue)


@njit(cache=True, _nrt=False, no_cpython_wrapper=True)
def _advance_queued(t, ht, hk, hn, due, ks, full, bundles, out, flag, changed, nch, residents, lazy, edue):
    """Pop every instance whose next event is at or before ``t``, run its
    steps to ``t`` (``advance``, by index), write its resident count
    (``residents[k]``: here, where its bundle is at hand, since taking a
    bundle out of the list costs more than the count), queue its next
    event and mark it changed (``flag``, ``changed[:nch[0]]``); ``lazy``:
    its next event is the end of the steady run in flight
    (``kernel.run_horizon``), for a loop whose router reads only the
    resident counts and that catches an instance up before handing it a
    request; ``edue[k]``: its next event whatever it is queued at. Returns how many ran,
    as ``-1 - n`` if a step log filled: then ``full[q]`` = 1 where instance
    ``ks[q]``'s did, which is neither queued nor marked (the caller
    flushes it, carries on and queues it)."""
    n = pop_due(t, ht, hk, hn, due, ks)
    filled = False
    for q in range(n):
        k = ks[q]
        st, plan, tw, model, log = borrow_item(bundles, k)
        full[q] = tk.advance(t, st, plan, tw, model, out, log)
        if full[q]:
            filled = True
            continue
        residents[k] = _residents(st, tw)
        e = edue[k] = tk.next_event(tw)
        _queue(k, tk.run_horizon(tw, model) if lazy else e, ht, hk, hn, due, flag, changed, nch)  # (due[k]: NaN)
    return -1 - n if filled else n


@njit(cache=True)
def bring_one(t, k, bundles, out, ht, hk, hn, due, edue, flag, changed, nch, residents,
              shadows, rows, hs, view_residents, predicted, sync, mode):
    """``_bring_one``, entered from Python (which unboxes the lists)."""
    return _bring_one(t, k, bundles, out, ht, hk, hn, due, edue, flag, changed, nch, residents, shadows, rows, hs,
                      view_residents, predicted, sync, mode)


@njit(cache=True, _nrt=False, no_cpython_wrapper=True)
def _bring_one(t, k, bundles, out, ht, hk, hn, due, edue, flag, changed, nch, residents,
               shadows, rows, hs, view_residents, predicted, sync, mode):
    """``EventQueue.bring`` in one compiled call: instance ``k``'s steps to
    ``t`` if one is due by then (``advance``, by index), its next event
    queued (the end of the steady run in flight, as ``advance_queued``'s
    lazy mode queues it; ``mode`` ON_READ: queued nowhere, the instance
    waits for its next read or request) and its view refreshed if it changed since its
    last refresh and ``sync`` (its view already holds its arrays). Why
    one call: from Python, ``Instance.advance`` unboxes some fifty arrays
    and ``touched`` and the view's refresh are three more crossings, about
    twice the steps a bring runs. Returns 1 when the step log filled
    (nothing queued or refreshed: the caller flushes and finishes in
    Python), else 0."""
    st, plan, tw, model, log = borrow_item(bundles, k)
    if edue[k] <= t:
        if tk.advance(t, st, plan, tw, model, out, log):
            return 1
        residents[k] = _residents(st, tw)
        edue[k] = tk.next_event(tw)
        if mode == ON_READ:
            _mark(k, flag, changed, nch)  # (queued nowhere: it waits for its next read or request)
        else:
            _queue(k, tk.run_horizon(tw, model), ht, hk, hn, due, flag, changed, nch)
    if sync and flag[k]:
        flag[k] = 0
        _sync_borrowed(k, st, tw, model, borrow_item(shadows, k), rows, hs, view_residents, predicted)
    return 0


@njit(cache=True)
def place_one(t, k, rid, prompt, target, hit, bundles, out, ht, hk, hn, due, edue, flag, changed, nch, residents,
              lazy):
    """``_place_one``, entered from Python (which unboxes the list)."""
    return _place_one(t, k, rid, prompt, target, hit, bundles, out, ht, hk, hn, due, edue, flag, changed, nch,
                      residents, lazy)


@njit(cache=True, _nrt=False, no_cpython_wrapper=True)
def _place_one(t, k, rid, prompt, target, hit, bundles, out, ht, hk, hn, due, edue, flag, changed, nch, residents,
               lazy):
    """Hand instance ``k`` request ``rid`` at ``t`` in one compiled call:
    its steps to ``t`` first if one is due by then (``EventQueue.catch_up``),
    the request into a free slot and the inbox (``Instance.add``: the
    caller checked there is a free slot and the prompt can reach the
    scheduler), an idle engine woken (``Instance.kick``), its next event
    queued (unless ``lazy`` is ON_READ) and it marked changed
    (``EventQueue.touched``). Why one call:
    these were four crossings from Python, each unboxing the instance's
    arrays, for a few stores. Returns the slot, or -1 when the step log
    filled (nothing added: the caller flushes and hands it in Python)."""
    st, plan, tw, model, log = borrow_item(bundles, k)
    if lazy and edue[k] <= t:
        if tk.advance(t, st, plan, tw, model, out, log):
            return -1
    slot = take_request(st.sc, st.free_slots, st.req, tw.inbox, tw.meta, rid, prompt, target, hit)
    wake(tw.meta, tw.times, model.gap, t)
    residents[k] = _residents(st, tw)
    d = edue[k] = tk.next_event(tw)
    if lazy == ON_READ:
        _mark(k, flag, changed, nch)
    else:
        _queue(k, d, ht, hk, hn, due, flag, changed, nch)
    return slot
