"""vLLM V1's prefix cache (``BlockPool``) over plain arrays, for the scheduler kernel.

The rules are vLLM 0.32's own (``vllm/v1/core/block_pool.py``,
``kv_cache_utils.FreeKVCacheBlockQueue``, ``single_type_kv_cache_manager``,
``kv_cache_manager``), checked against the source rather than a summary:

- Block 0 is the null block, popped from the free queue at creation; the
  usable blocks 1..N-1 start in the free queue in id order.
- The free queue is a doubly linked list; its head is the next block handed
  out (``popleft``). Handing out a block that still holds a hash evicts that
  hash from the map (``_maybe_evict_cached_block``).
- A request's hit is the longest run of leading full blocks whose hash is in
  the map, at most ``(num_tokens - 1) // block_size`` blocks
  (``get_computed_blocks``: ``max_cache_hit_length = num_tokens - 1``).
- Hit blocks are touched: ref count + 1, and a block whose count was 0 leaves
  the free queue (``touch``). So evictable hit blocks count against the free
  blocks in the admission gate (``_get_num_evictable_blocks``).
- Full blocks are registered at schedule time (``cache_blocks`` after
  ``allocate_slots``), so a later request in the same step can hit them.
- A hash may map to several blocks (the same content computed twice, e.g. a
  block recomputed because of the ``num_tokens - 1`` cap); the lookup returns
  the oldest (``BlockHashToBlockMap.get_one_block``: first of an insertion
  ordered dict), and eviction removes exactly the evicted block.
- Freeing walks a request's blocks tail first (``free``: ``reversed``); a
  block whose count drops to 0 joins the queue: blocks without a hash at the
  front (``prepend_n``, in walk order), blocks with one at the tail
  (``append_n``, in walk order), so eviction is LRU from the head and, within
  one request, the chain's tail goes first. Before vLLM 0.24 every such
  block joined the tail (``B_FREE_ALL_TO_TAIL``, set from the release's
  rules: ``estimators.engine.releases``).
- Free blocks = length of the free queue; evictable cached blocks count.

Why an open-addressing table (each cell's key and block side by side: a
lookup reads one cache line, and a warm cache's table is larger than L2): lookups and inserts are O(1) with no
allocation inside the kernel, and the table never needs to grow because each
block holds at most one hash (block size = hash block size), so there are
never more keys than blocks; a table of 2x the blocks (a power of two) keeps
the load at most 0.5. Linear probing with backward-shift deletion (Knuth's
Algorithm R) avoids tombstones, so a long run of evictions does not degrade
lookups. Sorted arrays would make every registration O(N).

A block's hash id (a request's trace ids, or its own past them) is
``block_ids``'; what one SFS estimate changes over a live pool without
copying it is ``block_overlay``'s.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from estimators.engine.block_ids import block_hash_at

NO_HASH = -1
EMPTY = -1  # free slot in the hash table

# scalars
B_NFREE = 0  # blocks in the free queue
B_NUM = 1  # blocks in the pool (including the null block)
B_MASK = 2  # hash table size - 1
B_HEAD = 3  # sentinel index of the free queue's head (= num_blocks)
B_TAIL = 4  # sentinel index of the free queue's tail (= num_blocks + 1)
B_EVICTIONS = 5  # hashes evicted so far
B_NFREE_CACHED = 6  # free blocks holding a hash (they sit behind every free block without one, from vLLM 0.24)
B_FREE_ALL_TO_TAIL = 7  # 1: vLLM before 0.24 (``releases.R_FREE_ALL_TO_TAIL``): every freed block joins the tail
NB = 8


class BlockCache(NamedTuple):
    """One instance's block pool and prefix cache (plain arrays)."""

    ref: np.ndarray  # int64[N]: ref count per block
    bhash: np.ndarray  # int64[N]: the block's hash id or NO_HASH
    dup_next: np.ndarray  # int64[N]: next block with the same hash (insertion order), -1 = none
    fprev: np.ndarray  # int64[N+2]: free queue links; N = head sentinel, N+1 = tail sentinel
    fnext: np.ndarray  # int64[N+2]
    kv: np.ndarray  # int64[2T]: hash table, cell i = (key, oldest block holding it) at 2i, 2i+1; key EMPTY = free
    fbits: np.ndarray  # int64[ceil(N / 64)]: bit b set = block b is in the free queue (its ref count is 0)
    sc: np.ndarray  # int64[NB]: scalars


def new_block_cache(num_blocks: int) -> BlockCache:
    """A pool of ``num_blocks`` blocks (one of them vLLM's null block), all free."""
    if num_blocks < 2:
        raise ValueError("a block pool needs at least 2 blocks (one is the null block)")
    n = int(num_blocks)
    size = 1
    while size < 2 * n:
        size *= 2
    fprev = np.full(n + 2, -1, dtype=np.int64)
    fnext = np.full(n + 2, -1, dtype=np.int64)
    head, tail = n, n + 1
    order = np.arange(1, n, dtype=np.int64)  # the null block (0) is popped at creation
    chain = np.concatenate(([head], order, [tail]))
    fnext[chain[:-1]] = chain[1:]
    fprev[chain[1:]] = chain[:-1]
    sc = np.zeros(NB, dtype=np.int64)
    sc[B_NFREE] = n - 1
    sc[B_NUM] = n
    sc[B_MASK] = size - 1
    sc[B_HEAD], sc[B_TAIL] = head, tail
    kv = np.empty(2 * size, dtype=np.int64)
    kv[0::2] = EMPTY
    kv[1::2] = -1
    free = np.zeros(((n + 63) // 64) * 64, dtype=bool)
    free[1:n] = True
    fbits = np.packbits(free, bitorder="little").view("<i8").copy()  # bit b of word b // 64 = block b
    return BlockCache(np.zeros(n, dtype=np.int64), np.full(n, NO_HASH, dtype=np.int64),
                      np.full(n, -1, dtype=np.int64), fprev, fnext, kv, fbits, sc)


def copy_block_cache(bc: BlockCache) -> BlockCache:
    return BlockCache(*(a.copy() for a in bc))


# ----------------------------------------------------------------- hash table
@njit(cache=True, inline="always")
def _home(key, mask):
    # splitmix64 finaliser: ids are often small consecutive integers
    z = np.uint64(key) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z & np.uint64(mask))


# Every helper called once per block takes plain arrays: a compiled call
# (or an inlined one) handed a bundle increments and decrements the
# reference count of each of its arrays, which costs more than the block
# operation itself. The per-request operations take the bundles once and
# loop over the arrays.

@njit(cache=True, inline="always")
def _find_in(kv, mask, key):
    """Table index holding ``key``, or -1."""
    i = _home(key, mask)
    while True:
        k = kv[2 * i]
        if k == key:
            return i
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def _lookup_in(kv, mask, key):
    """The block a hit on ``key`` gets (the oldest holding it), or -1."""
    i = _find_in(kv, mask, key)
    return kv[2 * i + 1] if i >= 0 else -1


@njit(cache=True)
def lookup(bc, key):
    """The block a hit on ``key`` gets (the oldest holding it), or -1."""
    return _lookup_in(bc.kv, bc.sc[B_MASK], key)


@njit(cache=True, inline="always")
def _table_delete_in(kv, mask, i):
    """Remove table entry ``i``, shifting later entries of its run back."""
    j = i
    while True:
        j = (j + 1) & mask
        if kv[2 * j] == EMPTY:
            break
        h = _home(kv[2 * j], mask)
        # move j into the hole at i unless its home lies cyclically in (i, j]
        if (j > i and (h <= i or h > j)) or (j < i and (h <= i and h > j)):
            kv[2 * i] = kv[2 * j]
            kv[2 * i + 1] = kv[2 * j + 1]
            i = j
    kv[2 * i] = EMPTY
    kv[2 * i + 1] = -1


@njit(cache=True, inline="always")
def _insert_hash_in(bhash, dup_next, kv, mask, key, b):
    """Register block ``b`` (without a hash) under ``key``."""
    bhash[b] = key
    dup_next[b] = -1
    i = _home(key, mask)
    while True:
        k = kv[2 * i]
        if k == EMPTY:
            kv[2 * i] = key
            kv[2 * i + 1] = b
            return
        if k == key:
            c = kv[2 * i + 1]
            while dup_next[c] >= 0:
                c = dup_next[c]
            dup_next[c] = b
            return
        i = (i + 1) & mask


@njit(cache=True)
def _insert_hash(bc, key, b):
    """Register block ``b`` (without a hash) under ``key``."""
    _insert_hash_in(bc.bhash, bc.dup_next, bc.kv, bc.sc[B_MASK], key, b)


@njit(cache=True, inline="always")
def _evict_hash_in(bhash, dup_next, kv, sc, b):
    """Drop block ``b``'s hash from the map (it is being reused)."""
    key = bhash[b]
    if key == NO_HASH:
        return
    mask = sc[B_MASK]
    i = _find_in(kv, mask, key)
    if i >= 0:
        c = kv[2 * i + 1]
        if c == b:
            nxt = dup_next[b]
            if nxt >= 0:
                kv[2 * i + 1] = nxt
            else:
                _table_delete_in(kv, mask, i)
        else:
            while c >= 0 and dup_next[c] != b:
                c = dup_next[c]
            if c >= 0:
                dup_next[c] = dup_next[b]
    dup_next[b] = -1
    bhash[b] = NO_HASH
    sc[B_EVICTIONS] += 1


@njit(cache=True)
def _evict_hash(bc, b):
    """Drop block ``b``'s hash from the map (it is being reused)."""
    _evict_hash_in(bc.bhash, bc.dup_next, bc.kv, bc.sc, b)


# ----------------------------------------------------------------- free queue
@njit(cache=True, inline="always")
def _fq_unlink(fprev, fnext, fbits, sc, b):
    p = fprev[b]
    n = fnext[b]
    fnext[p] = n
    fprev[n] = p
    fprev[b] = -1
    fnext[b] = -1
    fbits[b >> 6] &= ~(np.int64(1) << (b & 63))
    sc[B_NFREE] -= 1


@njit(cache=True, inline="always")
def _fq_insert_after(fprev, fnext, fbits, sc, p, b):
    n = fnext[p]
    fnext[p] = b
    fprev[b] = p
    fnext[b] = n
    fprev[n] = b
    fbits[b >> 6] |= np.int64(1) << (b & 63)
    sc[B_NFREE] += 1


@njit(cache=True, inline="always")
def is_free(fbits, b):
    """Block ``b`` sits in the free queue (a bit per block: the whole map of
    a 20,000-block pool fits in L1, where its ref counts do not fit in L2)."""
    return (fbits[b >> 6] >> (b & 63)) & 1 == 1


@njit(cache=True, inline="always")
def num_free(bc):
    """vLLM's ``get_num_free_blocks``: evictable cached blocks included."""
    return bc.sc[B_NFREE]


# ----------------------------------------------------------------- request operations
@njit(cache=True)
def find_hit(bc, hflat, hoff, hn, rid, num_tokens, block_size):
    """Blocks of the longest cached prefix (``get_computed_blocks``), capped
    so that at least one token is computed."""
    kv, mask = bc.kv, bc.sc[B_MASK]
    cap = (num_tokens - 1) // block_size
    k = 0
    while k < cap:
        if _find_in(kv, mask, block_hash_at(hflat, hoff, hn, rid, k)) < 0:
            break
        k += 1
    return k


@njit(cache=True)
def evictable_in_hit(bc, hflat, hoff, hn, rid, k):
    """Hit blocks currently in the free queue: touching them takes them out,
    so the admission gate counts them (``_get_num_evictable_blocks``)."""
    kv, mask, fbits = bc.kv, bc.sc[B_MASK], bc.fbits
    e = 0
    for i in range(k):
        if is_free(fbits, _lookup_in(kv, mask, block_hash_at(hflat, hoff, hn, rid, i))):
            e += 1
    return e


@njit(cache=True)
def touch_hit(bc, table_row, hflat, hoff, hn, rid, k):
    """Take the ``k`` hit blocks into the request's (empty) block table."""
    kv, sc, ref, fprev, fnext, fbits = bc.kv, bc.sc, bc.ref, bc.fprev, bc.fnext, bc.fbits
    mask = sc[B_MASK]
    for i in range(k):
        b = _lookup_in(kv, mask, block_hash_at(hflat, hoff, hn, rid, i))
        if ref[b] == 0:
            _fq_unlink(fprev, fnext, fbits, sc, b)
            sc[B_NFREE_CACHED] -= 1
        ref[b] += 1
        table_row[i] = b


@njit(cache=True)
def allocate(bc, table_row, held, total):
    """Grow the request's table from ``held`` to ``total`` blocks with blocks
    from the head of the free queue (``get_new_blocks``); the caller has
    checked that enough are free. Returns ``total``."""
    sc, ref, bhash, dup_next, fprev, fnext, kv = bc.sc, bc.ref, bc.bhash, bc.dup_next, bc.fprev, bc.fnext, bc.kv
    fbits = bc.fbits
    head = sc[B_HEAD]
    for i in range(held, total):
        b = fnext[head]
        _fq_unlink(fprev, fnext, fbits, sc, b)
        if bhash[b] != NO_HASH:
            sc[B_NFREE_CACHED] -= 1
            _evict_hash_in(bhash, dup_next, kv, sc, b)
        ref[b] = 1
        table_row[i] = b
    return total


@njit(cache=True)
def cache_full(bc, table_row, hflat, hoff, hn, rid, n_cached, n_full):
    """Register the request's blocks ``n_cached..n_full-1`` (just filled) in
    the map (``cache_full_blocks``); returns the new cached count."""
    bhash, dup_next, kv, mask = bc.bhash, bc.dup_next, bc.kv, bc.sc[B_MASK]
    for i in range(n_cached, n_full):
        b = table_row[i]
        if bhash[b] == NO_HASH:  # freshly allocated blocks never hold one
            _insert_hash_in(bhash, dup_next, kv, mask, block_hash_at(hflat, hoff, hn, rid, i), b)
    return n_full if n_full > n_cached else n_cached


@njit(cache=True)
def free_request(bc, table_row, held):
    """Release a request's ``held`` blocks (finish or preemption)."""
    sc, ref, bhash, fprev, fnext, fbits = bc.sc, bc.ref, bc.bhash, bc.fprev, bc.fnext, bc.fbits
    head = sc[B_HEAD]
    tail = sc[B_TAIL]
    everything_to_tail = sc[B_FREE_ALL_TO_TAIL] != 0
    # tail first: cached blocks whose count drops to 0 go to the queue's tail in that order (before vLLM 0.24,
    # every block whose count drops to 0: ``append_n`` of the walk's list)
    for i in range(held - 1, -1, -1):
        b = table_row[i]
        ref[b] -= 1
        if ref[b] == 0 and (everything_to_tail or bhash[b] != NO_HASH):
            _fq_insert_after(fprev, fnext, fbits, sc, fprev[tail], b)
            if bhash[b] != NO_HASH:
                sc[B_NFREE_CACHED] += 1
    # blocks without a hash go to the front, keeping the tail-first order
    # (prepend_n of the walk's list = push each to the front, walking head first)
    for i in range(held):
        b = table_row[i]
        if ref[b] == 0 and bhash[b] == NO_HASH and fprev[b] < 0:
            _fq_insert_after(fprev, fnext, fbits, sc, head, b)
    return 0


def free_queue_order(bc: BlockCache) -> list[int]:
    """The free queue head to tail (tests and diagnostics)."""
    out = []
    b = int(bc.fnext[bc.sc[B_HEAD]])
    while b != bc.sc[B_TAIL]:
        out.append(b)
        b = int(bc.fnext[b])
    return out


def cached_map(bc: BlockCache) -> dict[int, list[int]]:
    """hash id -> blocks holding it, oldest first (tests and diagnostics)."""
    out = {}
    for i in np.flatnonzero(bc.kv[0::2] != EMPTY):
        chain, c = [], int(bc.kv[2 * i + 1])
        while c >= 0:
            chain.append(c)
            c = int(bc.dup_next[c])
        out[int(bc.kv[2 * i])] = chain
    return out
