"""The SFS overlay over vLLM's block pool (``block_pool``): what one SFS
estimate changes on top of a live cache it reads without copying it
(``Overlay`` below says how), forgotten at the next estimate.

Split from the pool because it is a second structure with its own rules
(epochs, deferred releases, the fallback to a copy); it reads the pool's
arrays through the pool's own hash-table and free-queue helpers.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from estimators.engine.block_ids import block_hash_at, ids_of
from estimators.engine.block_pool import B_HEAD, B_MASK, B_NFREE_CACHED, B_TAIL, NO_HASH, _lookup_in, is_free


class Overlay(NamedTuple):
    """What one SFS simulation changed on top of the live cache it reads
    without copying, forgotten at the next estimate without clearing the
    per-block words (their epoch stops matching):

    - the blocks the simulated steps registered, as one range of block
      positions per request (``rng[s]``: first, end, request id; a
      request registers its blocks in order, and after a preemption again
      from where its hit ends, so the union stays one range); a lookup that
      misses the live cache asks them (``_simulated``). Registering costs
      O(1) however long the prompt, and the requests that register are few;
    - one word per live block ``b`` (``bst[b]``, dense: a release of a long
      context costs one read-modify-write per block, not a hash probe, and
      nothing to clear afterwards): the estimate's epoch, flags (TOUCHED: a
      live free block the simulation took or released, no longer where the
      live free queue has it; EVICTED) and the simulation's change to the
      block's reference count. A word from an earlier epoch reads as
      untouched (``_word``).

    Whether a live holder's block counts as cached once freed follows from
    its position: its first ``F_NCACHED`` blocks hold a hash (hit or
    registered), live or registered by the simulation, the rest none.

    Evictions follow vLLM's order: blocks without a hash first (counted),
    then the live cached free blocks from the least recently used
    (``OV_CURSOR`` walks the live free queue, skipping blocks the simulation
    touched), flagged EVICTED so their hashes stop hitting. Counting is
    exact until the simulation hits a block only it computed or evicts past
    the live free queue's end (into blocks it freed itself); then it raises
    ``sc[OV_FALLBACK]`` and SFS reruns on a full copy (``estimators.sfs.kernel``)."""

    rng: np.ndarray  # int64[S, 3]: per slot, the block positions registered by the simulation [lo, hi) and its rid
    rslots: np.ndarray  # int64[S]: the slots with a range, in order (hi = 0: none)
    sc: np.ndarray  # OV_* scalars
    bst: np.ndarray  # int64[N]: epoch | flags | biased reference-count change of live block b
    pend: np.ndarray  # int64[2 P]: deferred releases (slot, blocks), see ``ov_defer``
    hitb: np.ndarray  # int64[H]: the live blocks of the last hit looked up (``find_hit_overlay``)


OV_NRANGE = 0  # slots with a range of registered blocks
OV_FALLBACK = 1  # the overlay cannot follow: rerun on a copy
OV_CACHED_FREE = 2  # free blocks holding a hash, as the simulation goes
OV_EXACT = 3  # set by the caller: this run is the rerun on a copy
OV_CURSOR = 4  # next live free block to evict (-1: not found yet)
OV_BASE = 5  # this estimate's untouched word: epoch << EP_SHIFT | DBIAS
OV_NPEND = 6  # deferred releases waiting in ``pend``
OV_WORDS = 7  # 1 once this estimate has written a block's word: until then every word reads untouched
OV_SETTLES = 8  # deferred releases a gate needed, over the overlay's life (diagnostics: never cleared)
OV_PENDTOUCH = 9  # an admission's hit blocks (``hitb[:k]``) whose words are not written yet (``_flush_touch``)
OV_HIT_RID = 10  # the last lookup (``find_hit_overlay``): request, hit blocks, of which free
OV_HIT_K = 11
OV_HIT_E = 12
NOV = 13
PEND_SLOTS = 256  # deferred releases held before they are settled anyway
TOUCHED, EVICTED = 1, 4  # flag bits
EP_SHIFT = 24  # a word's epoch: bits 24..62
FL_SHIFT = 20  # its flags: bits 20..23
DBIAS = 1 << 19  # its count change, biased: bits 0..19
DMASK = (1 << 20) - 1
TF = TOUCHED << FL_SHIFT
EF = EVICTED << FL_SHIFT


def new_overlay(num_blocks: int = 0, slots: int = 2, hit_blocks: int = 0) -> Overlay:
    """An empty overlay for a cache of ``num_blocks`` blocks and a state of
    ``slots`` slots, remembering hits of up to ``hit_blocks`` blocks (longer
    ones are looked up again)."""
    return Overlay(np.zeros((slots, 3), dtype=np.int64), np.zeros(slots, dtype=np.int64), np.zeros(NOV, dtype=np.int64),
                   np.zeros(num_blocks, dtype=np.int64), np.zeros(2 * PEND_SLOTS, dtype=np.int64),
                   np.zeros(hit_blocks, dtype=np.int64))


@njit(cache=True)
def ov_clear(ov, bc):
    for j in range(ov.sc[OV_NRANGE]):
        ov.rng[ov.rslots[j], 1] = 0
    ov.sc[OV_NRANGE] = 0
    ov.sc[OV_FALLBACK] = 0
    ov.sc[OV_CACHED_FREE] = bc.sc[B_NFREE_CACHED]
    ov.sc[OV_CURSOR] = -1
    ov.sc[OV_NPEND] = 0
    ov.sc[OV_WORDS] = 0
    ov.sc[OV_PENDTOUCH] = 0
    ov.sc[OV_HIT_RID] = -1
    ov.sc[OV_BASE] = (((ov.sc[OV_BASE] >> EP_SHIFT) + 1) << EP_SHIFT) | DBIAS  # a new epoch: every word untouched


@njit(cache=True, inline="always")
def _word(bst, base, b):
    """Live block ``b``'s word in this estimate (``base`` if untouched)."""
    w = bst[b]
    return w if (w >> EP_SHIFT) == (base >> EP_SHIFT) else base


@njit(cache=True, inline="always")
def _delta(w):
    """The reference-count change a word holds."""
    return (w & DMASK) - DBIAS


@njit(cache=True, inline="always")
def _flush_touch(osc, bst, hitb):
    """Write the words of a touch ``ov_touch`` left pending. Every function
    that reads or writes words (or the lookup's ``hitb``) calls this first,
    so a pending touch is never observed."""
    k = osc[OV_PENDTOUCH]
    if k > 0:
        w = (osc[OV_BASE] + 1) | TF  # no word had been written: each was untouched
        for i in range(k):
            bst[hitb[i]] = w
        osc[OV_PENDTOUCH] = 0
        osc[OV_WORDS] = 1


@njit(cache=True)
def ov_evict(bc, ov, m):
    """Evict ``m`` cached free blocks, least recently used first."""
    _flush_touch(ov.sc, ov.bst, ov.hitb)
    bst, fnext = ov.bst, bc.fnext
    base = ov.sc[OV_BASE]
    tail = bc.sc[B_TAIL]
    c = ov.sc[OV_CURSOR]
    if c < 0:  # the first cached block: every free block without a hash comes before it
        c = fnext[bc.sc[B_HEAD]]
        while c != tail and bc.bhash[c] == NO_HASH:
            c = fnext[c]
    for _ in range(m):
        while c != tail and _word(bst, base, c) & TF:
            c = fnext[c]  # touched (or released) by the simulation: not where the live queue has it
        if c == tail:
            ov.sc[OV_FALLBACK] = 1  # next come blocks the simulation freed itself
            return
        bst[c] = _word(bst, base, c) | EF
        ov.sc[OV_WORDS] = 1
        c = fnext[c]
    ov.sc[OV_CURSOR] = c
    ov.sc[OV_CACHED_FREE] -= m


@njit(cache=True, inline="always")
def _live_in(kv, mask, dup_next, bst, base, evicting, h):
    """The block a hit on ``h`` gets in the simulation: the oldest live block
    holding it that the simulation has not evicted, or -1."""
    b = _lookup_in(kv, mask, h)
    if not evicting:
        return b  # nothing evicted yet
    while b >= 0 and _word(bst, base, b) & EF:
        b = dup_next[b]
    return b


@njit(cache=True, inline="always")
def ov_register(osc, rng, rslots, s, rid, lo, hi):
    """The simulation registered request ``rid``'s (slot ``s``) blocks ``lo..hi-1``."""
    if rng[s, 1] == 0:
        rslots[osc[OV_NRANGE]] = s
        osc[OV_NRANGE] += 1
        rng[s, 0] = lo
        rng[s, 2] = rid
    elif lo < rng[s, 0]:
        rng[s, 0] = lo
    if hi > rng[s, 1]:
        rng[s, 1] = hi


@njit(cache=True)
def _simulated(ov, hashes, k, h):
    """Block id ``h`` at position ``k`` was registered by the simulation
    (ids are prefix-chained, so only a block at the same position can
    carry it)."""
    rng, rslots = ov.rng, ov.rslots
    for j in range(ov.sc[OV_NRANGE]):
        s = rslots[j]
        if rng[s, 0] <= k < rng[s, 1]:
            off, n = ids_of(hashes, rng[s, 2])
            if block_hash_at(hashes.flat, off, n, rng[s, 2], k) == h:
                return True
    return False


@njit(cache=True)
def find_hit_overlay(bc, ov, hashes, hoff, hn, rid, num_tokens, block_size):
    """``find_hit`` against the live cache (read only), and how many of the
    hit blocks are free as the simulation stands (live count plus its
    changes: ``evictable_in_hit``). One lookup per block: the blocks found
    are kept in ``ov.hitb`` for ``ov_touch``. A hit on a block only the
    simulation computed falls back (whose block it is is not followed)."""
    kv, mask, dup_next, ref = bc.kv, bc.sc[B_MASK], bc.dup_next, bc.ref
    osc, bst, hitb, hflat, fbits = ov.sc, ov.bst, ov.hitb, hashes.flat, bc.fbits
    _flush_touch(osc, bst, hitb)
    base = osc[OV_BASE]
    evicting = osc[OV_CURSOR] >= 0
    simulated = osc[OV_NRANGE] > 0
    words = osc[OV_WORDS] != 0  # else no block's word need be read: a cache miss per block saved
    cap = (num_tokens - 1) // block_size
    k = 0
    e = 0
    while k < cap:
        h = block_hash_at(hflat, hoff, hn, rid, k)
        b = _live_in(kv, mask, dup_next, bst, base, evicting, h)
        if b < 0:
            if simulated and _simulated(ov, hashes, k, h):
                osc[OV_FALLBACK] = 1
            break
        if (ref[b] + _delta(_word(bst, base, b)) == 0) if words else is_free(fbits, b):
            e += 1
        if k < hitb.size:
            hitb[k] = b
        k += 1
    osc[OV_HIT_RID] = rid
    osc[OV_HIT_K] = k
    osc[OV_HIT_E] = e
    return k, e


@njit(cache=True)
def ov_touch(bc, ov, hflat, hoff, hn, rid, k):
    """A simulated admission takes its ``k`` hit blocks, just found by
    ``find_hit_overlay`` (``ov.hitb``; looked up again past its size), and
    returns how many left the free queue: the lookup's count (nothing moved
    in between: a gate that settles deferred releases looks again). Called
    other than right after its own lookup, it falls back to the copy.

    While no word has been written in this estimate (the usual case: one
    admission, the query), the words are left to write (``_flush_touch``):
    the touch costs O(1), where writing a word per block of a long prompt
    misses the cache at each."""
    kv, mask, dup_next = bc.kv, bc.sc[B_MASK], bc.dup_next
    bst, osc, hitb = ov.bst, ov.sc, ov.hitb
    _flush_touch(osc, bst, hitb)
    if k == 0:
        return 0
    if osc[OV_HIT_RID] != rid or osc[OV_HIT_K] != k:
        osc[OV_FALLBACK] = 1
        return 0
    e = osc[OV_HIT_E]
    osc[OV_HIT_RID] = -1
    osc[OV_CACHED_FREE] -= e
    if osc[OV_WORDS] == 0 and k <= hitb.size:
        osc[OV_PENDTOUCH] = k
        return e
    base = osc[OV_BASE]
    evicting = osc[OV_CURSOR] >= 0
    for i in range(k):  # (hit blocks are distinct: these writes never meet these reads)
        if i < hitb.size:
            b = hitb[i]
        else:
            b = _live_in(kv, mask, dup_next, bst, base, evicting, block_hash_at(hflat, hoff, hn, rid, i))
        bst[b] = (_word(bst, base, b) + 1) | TF
    osc[OV_WORDS] = 1
    return e


@njit(cache=True)
def ov_release_live(bc, ov, table_row, held, ncached):
    """The simulation releases a request holding live blocks (its table,
    the first ``ncached`` holding a hash, live or registered by the
    simulation); returns how many become free. The loop that makes a long
    context's release cost: one read of the live count and one
    read-modify-write of the block's word."""
    ref, bst, osc = bc.ref, ov.bst, ov.sc
    _flush_touch(osc, bst, ov.hitb)
    base = osc[OV_BASE]
    ep = base >> EP_SHIFT
    freed = 0
    cached = 0
    for i in range(held):
        b = table_row[i]
        w = bst[b]
        if (w >> EP_SHIFT) != ep:
            w = base
        w -= 1
        bst[b] = w
        if ref[b] + (w & DMASK) == DBIAS:
            freed += 1
            if i < ncached:
                cached += 1
    if held > 0:
        osc[OV_WORDS] = 1
    osc[OV_CACHED_FREE] += cached
    return freed


@njit(cache=True, inline="always")
def ov_defer(osc, pend, slot, n):
    """Defer the release of live holder ``slot``'s first ``n`` blocks (each
    holds a hash). False if the list is full (the caller releases now).

    Why deferring is exact: a freed block with a hash joins the free queue's
    tail, so it adds one to the free count and one to the cached free count
    alike; evictions take ``cached free - free`` blocks (the blocks without
    a hash come first) and walk the live queue from the head, never reaching
    a block held when the estimate began; and a hit on a block whose release
    is deferred is counted neither as free nor as evictable, the same
    difference in the admission gate as counting it as both. So the only
    thing a deferred release changes is that the free count is a lower
    bound, and every gate that would fail on it settles first
    (``ov_settle``). A finishing resident of a warm cache holds hundreds of
    blocks, most shared by a system prompt, and the gates rarely need them:
    the per-block walk is skipped."""
    k = osc[OV_NPEND]
    room = 2 * k + 1 < pend.size
    if room:
        pend[2 * k] = slot
        pend[2 * k + 1] = n
        osc[OV_NPEND] = k + 1
    return room


@njit(cache=True)
def ov_settle(bc, ov, table):
    """Carry out the deferred releases, in the order they were deferred;
    returns how many blocks became free."""
    freed = 0
    for k in range(ov.sc[OV_NPEND]):
        s, n = ov.pend[2 * k], ov.pend[2 * k + 1]
        freed += ov_release_live(bc, ov, table[s], n, n)
        ov.sc[OV_SETTLES] += 1
    ov.sc[OV_NPEND] = 0
    return freed


@njit(cache=True)
def ov_release_hits(bc, ov, hflat, hoff, hn, rid, k):
    """A request admitted in the simulation lets go of its ``k`` live hit
    blocks (each holds a live hash); returns how many become free."""
    kv, mask, dup_next, ref = bc.kv, bc.sc[B_MASK], bc.dup_next, bc.ref
    bst, osc = ov.bst, ov.sc
    _flush_touch(osc, bst, ov.hitb)
    base = osc[OV_BASE]
    evicting = osc[OV_CURSOR] >= 0
    freed = 0
    for i in range(k):
        b = _live_in(kv, mask, dup_next, bst, base, evicting, block_hash_at(hflat, hoff, hn, rid, i))
        w = (_word(bst, base, b) - 1) | TF
        bst[b] = w
        if ref[b] + _delta(w) == 0:
            freed += 1
    if k > 0:
        osc[OV_WORDS] = 1
    osc[OV_CACHED_FREE] += freed
    return freed
