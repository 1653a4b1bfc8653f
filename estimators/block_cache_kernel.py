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
  one request, the chain's tail goes first.
- Free blocks = length of the free queue; evictable cached blocks count.

Why an open-addressing table: lookups and inserts are O(1) with no
allocation inside the kernel, and the table never needs to grow because each
block holds at most one hash (block size = hash block size), so there are
never more keys than blocks; a table of 2x the blocks (a power of two) keeps
the load at most 0.5. Linear probing with backward-shift deletion (Knuth's
Algorithm R) avoids tombstones, so a long run of evictions does not degrade
lookups. Sorted arrays would make every registration O(N).

Block hash ids are non-negative int64 (``NO_HASH`` = -1 marks a block
without one). A request's i-th full block has the id its trace gives
(``hash_ids[i]``), or past those (the partial prompt tail and outputs) an id
unique to the request, ``own_block_id(rid, i)``, so a resumed request hits its
own surviving blocks, outputs included, and nobody else does.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

NO_HASH = -1
EMPTY = -1  # free slot in the hash table

OWN_BASE = 1 << 62  # ids at or above this are a request's own blocks
OWN_BLOCK_BITS = 21  # up to 2M blocks per request; request ids below 2**41
MAX_SHARED_ID = OWN_BASE - 1

# scalars
B_NFREE = 0  # blocks in the free queue
B_NUM = 1  # blocks in the pool (including the null block)
B_MASK = 2  # hash table size - 1
B_HEAD = 3  # sentinel index of the free queue's head (= num_blocks)
B_TAIL = 4  # sentinel index of the free queue's tail (= num_blocks + 1)
B_EVICTIONS = 5  # hashes evicted so far
B_NFREE_CACHED = 6  # free blocks holding a hash (they sit behind every free block without one)
NB = 7


class BlockCache(NamedTuple):
    """One instance's block pool and prefix cache (plain arrays)."""

    ref: np.ndarray  # int64[N]: ref count per block
    bhash: np.ndarray  # int64[N]: the block's hash id or NO_HASH
    dup_next: np.ndarray  # int64[N]: next block with the same hash (insertion order), -1 = none
    fprev: np.ndarray  # int64[N+2]: free queue links; N = head sentinel, N+1 = tail sentinel
    fnext: np.ndarray  # int64[N+2]
    keys: np.ndarray  # int64[T]: hash table keys (EMPTY = free)
    vals: np.ndarray  # int64[T]: oldest block holding the key
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
    return BlockCache(np.zeros(n, dtype=np.int64), np.full(n, NO_HASH, dtype=np.int64),
                      np.full(n, -1, dtype=np.int64), fprev, fnext,
                      np.full(size, EMPTY, dtype=np.int64), np.full(size, -1, dtype=np.int64), sc)


def copy_block_cache(bc: BlockCache) -> BlockCache:
    return BlockCache(*(a.copy() for a in bc))


# ----------------------------------------------------------------- block ids
@njit(cache=True, inline="always")
def own_block_id(rid, i):
    """The id of block ``i`` of request ``rid`` when its content is the
    request's own (past the trace's shared ids): never equal to a shared id
    (those are below OWN_BASE) nor to another request's."""
    return OWN_BASE + (rid << OWN_BLOCK_BITS) + i


@njit(cache=True, inline="always")
def block_hash_at(hflat, hoff, hn, rid, i):
    """Hash id of request ``rid``'s i-th full block: its trace id
    ``hflat[hoff + i]`` for the first ``hn`` blocks, else its own id."""
    if i < hn:
        return hflat[hoff + i]
    return own_block_id(rid, i)


# ----------------------------------------------------------------- hash table
@njit(cache=True, inline="always")
def _home(key, mask):
    # splitmix64 finaliser: ids are often small consecutive integers
    z = np.uint64(key) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z & np.uint64(mask))


@njit(cache=True)
def _find(bc, key):
    """Table index holding ``key``, or -1."""
    mask = bc.sc[B_MASK]
    i = _home(key, mask)
    while True:
        k = bc.keys[i]
        if k == key:
            return i
        if k == EMPTY:
            return -1
        i = (i + 1) & mask


@njit(cache=True)
def lookup(bc, key):
    """The block a hit on ``key`` gets (the oldest holding it), or -1."""
    i = _find(bc, key)
    return bc.vals[i] if i >= 0 else -1


@njit(cache=True)
def _table_delete(bc, i):
    """Remove table entry ``i``, shifting later entries of its run back."""
    mask = bc.sc[B_MASK]
    j = i
    while True:
        j = (j + 1) & mask
        if bc.keys[j] == EMPTY:
            break
        h = _home(bc.keys[j], mask)
        # move j into the hole at i unless its home lies cyclically in (i, j]
        if (j > i and (h <= i or h > j)) or (j < i and (h <= i and h > j)):
            bc.keys[i] = bc.keys[j]
            bc.vals[i] = bc.vals[j]
            i = j
    bc.keys[i] = EMPTY
    bc.vals[i] = -1


@njit(cache=True)
def _insert_hash(bc, key, b):
    """Register block ``b`` (without a hash) under ``key``."""
    bc.bhash[b] = key
    bc.dup_next[b] = -1
    mask = bc.sc[B_MASK]
    i = _home(key, mask)
    while True:
        k = bc.keys[i]
        if k == EMPTY:
            bc.keys[i] = key
            bc.vals[i] = b
            return
        if k == key:
            c = bc.vals[i]
            while bc.dup_next[c] >= 0:
                c = bc.dup_next[c]
            bc.dup_next[c] = b
            return
        i = (i + 1) & mask


@njit(cache=True)
def _evict_hash(bc, b):
    """Drop block ``b``'s hash from the map (it is being reused)."""
    key = bc.bhash[b]
    if key == NO_HASH:
        return
    i = _find(bc, key)
    if i >= 0:
        c = bc.vals[i]
        if c == b:
            nxt = bc.dup_next[b]
            if nxt >= 0:
                bc.vals[i] = nxt
            else:
                _table_delete(bc, i)
        else:
            while c >= 0 and bc.dup_next[c] != b:
                c = bc.dup_next[c]
            if c >= 0:
                bc.dup_next[c] = bc.dup_next[b]
    bc.dup_next[b] = -1
    bc.bhash[b] = NO_HASH
    bc.sc[B_EVICTIONS] += 1


# ----------------------------------------------------------------- free queue
@njit(cache=True, inline="always")
def _fq_unlink(bc, b):
    p = bc.fprev[b]
    n = bc.fnext[b]
    bc.fnext[p] = n
    bc.fprev[n] = p
    bc.fprev[b] = -1
    bc.fnext[b] = -1
    bc.sc[B_NFREE] -= 1


@njit(cache=True, inline="always")
def _fq_insert_after(bc, p, b):
    n = bc.fnext[p]
    bc.fnext[p] = b
    bc.fprev[b] = p
    bc.fnext[b] = n
    bc.fprev[n] = b
    bc.sc[B_NFREE] += 1


@njit(cache=True, inline="always")
def num_free(bc):
    """vLLM's ``get_num_free_blocks``: evictable cached blocks included."""
    return bc.sc[B_NFREE]


# ----------------------------------------------------------------- request operations
@njit(cache=True)
def find_hit(bc, hflat, hoff, hn, rid, num_tokens, block_size):
    """Blocks of the longest cached prefix (``get_computed_blocks``), capped
    so that at least one token is computed."""
    cap = (num_tokens - 1) // block_size
    k = 0
    while k < cap:
        if _find(bc, block_hash_at(hflat, hoff, hn, rid, k)) < 0:
            break
        k += 1
    return k


@njit(cache=True)
def evictable_in_hit(bc, hflat, hoff, hn, rid, k):
    """Hit blocks currently in the free queue: touching them takes them out,
    so the admission gate counts them (``_get_num_evictable_blocks``)."""
    e = 0
    for i in range(k):
        if bc.ref[lookup(bc, block_hash_at(hflat, hoff, hn, rid, i))] == 0:
            e += 1
    return e


@njit(cache=True)
def touch_hit(bc, table_row, hflat, hoff, hn, rid, k):
    """Take the ``k`` hit blocks into the request's (empty) block table."""
    for i in range(k):
        b = lookup(bc, block_hash_at(hflat, hoff, hn, rid, i))
        if bc.ref[b] == 0:
            _fq_unlink(bc, b)
            bc.sc[B_NFREE_CACHED] -= 1
        bc.ref[b] += 1
        table_row[i] = b


@njit(cache=True)
def allocate(bc, table_row, held, total):
    """Grow the request's table from ``held`` to ``total`` blocks with blocks
    from the head of the free queue (``get_new_blocks``); the caller has
    checked that enough are free. Returns ``total``."""
    head = bc.sc[B_HEAD]
    for i in range(held, total):
        b = bc.fnext[head]
        _fq_unlink(bc, b)
        if bc.bhash[b] != NO_HASH:
            bc.sc[B_NFREE_CACHED] -= 1
        _evict_hash(bc, b)
        bc.ref[b] = 1
        table_row[i] = b
    return total


@njit(cache=True)
def cache_full(bc, table_row, hflat, hoff, hn, rid, n_cached, n_full):
    """Register the request's blocks ``n_cached..n_full-1`` (just filled) in
    the map (``cache_full_blocks``); returns the new cached count."""
    for i in range(n_cached, n_full):
        b = table_row[i]
        if bc.bhash[b] == NO_HASH:  # freshly allocated blocks never hold one
            _insert_hash(bc, block_hash_at(hflat, hoff, hn, rid, i), b)
    return n_full if n_full > n_cached else n_cached


@njit(cache=True)
def free_request(bc, table_row, held):
    """Release a request's ``held`` blocks (finish or preemption)."""
    head = bc.sc[B_HEAD]
    tail = bc.sc[B_TAIL]
    # tail first: cached blocks whose count drops to 0 go to the queue's tail in that order
    for i in range(held - 1, -1, -1):
        b = table_row[i]
        bc.ref[b] -= 1
        if bc.ref[b] == 0 and bc.bhash[b] != NO_HASH:
            _fq_insert_after(bc, bc.fprev[tail], b)
            bc.sc[B_NFREE_CACHED] += 1
    # blocks without a hash go to the front, keeping the tail-first order
    # (prepend_n of the walk's list = push each to the front, walking head first)
    for i in range(held):
        b = table_row[i]
        if bc.ref[b] == 0 and bc.bhash[b] == NO_HASH and bc.fprev[b] < 0:
            _fq_insert_after(bc, head, b)
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
    for i in np.flatnonzero(bc.keys != EMPTY):
        chain, c = [], int(bc.vals[i])
        while c >= 0:
            chain.append(c)
            c = int(bc.dup_next[c])
        out[int(bc.keys[i])] = chain
    return out


# ----------------------------------------------------------------- per-trace block ids
class RequestHashes(NamedTuple):
    """Every request's full-block ids for one engine block size: request
    ``rid`` (its row in the trace) has ``flat[off[rid]:off[rid] + cnt[rid]]``;
    rows beyond ``cnt``'s length (or without ids) have none, so all their
    blocks are their own."""

    flat: np.ndarray
    off: np.ndarray
    cnt: np.ndarray


def no_request_hashes() -> RequestHashes:
    z = np.zeros(0, dtype=np.int64)
    return RequestHashes(z, z.copy(), z.copy())


def request_hashes(hash_ids_col, prompt_tokens, hash_block_tokens: int | None, block_size: int) -> RequestHashes:
    """``RequestHashes`` of a trace's ``requests.hash_ids`` (see ``traces.prefix_blocks``)."""
    from traces.prefix_blocks import flat_block_ids

    if hash_ids_col is None or not hash_block_tokens:
        return no_request_hashes()
    return RequestHashes(*flat_block_ids(hash_ids_col, prompt_tokens, hash_block_tokens, block_size))


@njit(cache=True, inline="always")
def ids_of(hashes, rid):
    """(offset, count) of request ``rid``'s trace ids."""
    if rid < hashes.cnt.size:
        return hashes.off[rid], hashes.cnt[rid]
    return 0, 0


# ----------------------------------------------------------------- overlay (SFS)
class Overlay(NamedTuple):
    """What one SFS simulation changed on top of the live cache it reads
    without copying: an open-addressing map whose used cells are listed, so
    clearing costs what the last estimate used. Keys: hash ids (>= 0)
    registered by the simulated steps (value 1); ``-(b + 2)`` for a live
    block b whose reference count the simulation changed (value: the
    change); ``-(b + 2) - REGISTERED`` for a live block the simulation
    filled and registered (it is cached once freed).

    Evictions follow vLLM's order: blocks without a hash first (counted),
    then the live cached free blocks from the least recently used
    (``OV_CURSOR`` walks the live free queue, skipping blocks the simulation
    touched), marked ``-(b + 2) - EVICTED`` so their hashes stop hitting.
    Counting is exact until the simulation hits a block only it computed or
    evicts past the live free queue's end (into blocks it freed itself);
    then it raises ``sc[OV_FALLBACK]`` and SFS reruns on a full copy
    (``sfs_kernel``)."""

    keys: np.ndarray  # int64[M], EMPTY = free
    vals: np.ndarray  # int64[M]
    used: np.ndarray  # int64[M // 2]: cells filled, in order
    sc: np.ndarray  # OV_* scalars


OV_USED = 0  # cells used
OV_FALLBACK = 1  # the overlay cannot follow: rerun on a copy
OV_CACHED_FREE = 2  # free blocks holding a hash, as the simulation goes
OV_EXACT = 3  # set by the caller: this run is the rerun on a copy
OV_CURSOR = 4  # next live free block to evict (-1: not found yet)
NOV = 5
REGISTERED = 1 << 40  # key -(b + 2) - REGISTERED: live block b filled and registered by the simulation
EVICTED = 2 << 40  # key -(b + 2) - EVICTED: live free block b evicted by the simulation


def new_overlay(size: int = 1 << 15) -> Overlay:
    return Overlay(np.full(size, EMPTY, dtype=np.int64), np.zeros(size, dtype=np.int64),
                   np.zeros(size // 2, dtype=np.int64), np.zeros(NOV, dtype=np.int64))


@njit(cache=True)
def ov_clear(ov, bc):
    for i in range(ov.sc[OV_USED]):
        ov.keys[ov.used[i]] = EMPTY
    ov.sc[OV_USED] = 0
    ov.sc[OV_FALLBACK] = 0
    ov.sc[OV_CACHED_FREE] = bc.sc[B_NFREE_CACHED]
    ov.sc[OV_CURSOR] = -1


@njit(cache=True)
def ov_evict(bc, ov, m):
    """Evict ``m`` cached free blocks, least recently used first."""
    tail = bc.sc[B_TAIL]
    c = ov.sc[OV_CURSOR]
    if c < 0:  # the first cached block: every free block without a hash comes before it
        c = bc.fnext[bc.sc[B_HEAD]]
        while c != tail and bc.bhash[c] == NO_HASH:
            c = bc.fnext[c]
    for _ in range(m):
        while c != tail and _ov_cell(ov, -(c + 2), False) >= 0:
            c = bc.fnext[c]  # touched (or released) by the simulation: not where the live queue has it
        if c == tail:
            ov.sc[OV_FALLBACK] = 1  # next come blocks the simulation freed itself
            return
        ov_add(ov, -(c + 2) - EVICTED)
        c = bc.fnext[c]
    ov.sc[OV_CURSOR] = c
    ov.sc[OV_CACHED_FREE] -= m


@njit(cache=True)
def _live_block(bc, ov, h):
    """The block a hit on ``h`` gets in the simulation: the oldest live block
    holding it that the simulation has not evicted, or -1."""
    b = lookup(bc, h)
    if ov.sc[OV_CURSOR] < 0:
        return b  # nothing evicted yet
    while b >= 0 and _ov_cell(ov, -(b + 2) - EVICTED, False) >= 0:
        b = bc.dup_next[b]
    return b


@njit(cache=True)
def _ov_cell(ov, key, insert):
    """Index of ``key``'s cell (inserted with value 0 if asked), or -1."""
    mask = ov.keys.size - 1
    i = _home(key, mask)
    while True:
        k = ov.keys[i]
        if k == key:
            return i
        if k == EMPTY:
            if not insert:
                return -1
            if ov.sc[OV_USED] >= ov.used.size:
                ov.sc[OV_FALLBACK] = 1  # full: the overlay can no longer answer
                return -1
            ov.keys[i] = key
            ov.vals[i] = 0
            ov.used[ov.sc[OV_USED]] = i
            ov.sc[OV_USED] += 1
            return i
        i = (i + 1) & mask


@njit(cache=True, inline="always")
def ov_add(ov, key):
    i = _ov_cell(ov, key, True)
    if i >= 0:
        ov.vals[i] = 1


@njit(cache=True, inline="always")
def _ref_delta(ov, b):
    i = _ov_cell(ov, -(b + 2), False)
    return ov.vals[i] if i >= 0 else 0


@njit(cache=True)
def find_hit_overlay(bc, ov, hflat, hoff, hn, rid, num_tokens, block_size):
    """``find_hit`` against the live cache (read only) plus the overlay."""
    cap = (num_tokens - 1) // block_size
    k = 0
    while k < cap:
        h = block_hash_at(hflat, hoff, hn, rid, k)
        if _live_block(bc, ov, h) < 0 and _ov_cell(ov, h, False) < 0:
            break
        k += 1
    return k


@njit(cache=True)
def evictable_overlay(bc, ov, hflat, hoff, hn, rid, k):
    """Hit blocks that are free as the simulation stands (live count plus its changes)."""
    e = 0
    for i in range(k):
        b = _live_block(bc, ov, block_hash_at(hflat, hoff, hn, rid, i))
        if b >= 0 and bc.ref[b] + _ref_delta(ov, b) == 0:
            e += 1
    return e


@njit(cache=True)
def ov_touch(bc, ov, hflat, hoff, hn, rid, k):
    """A simulated admission takes its ``k`` hit blocks; returns how many
    left the free queue. A hit on blocks only the simulation computed falls
    back (whose blocks they are is not followed)."""
    e = 0
    for i in range(k):
        b = _live_block(bc, ov, block_hash_at(hflat, hoff, hn, rid, i))
        if b < 0:
            ov.sc[OV_FALLBACK] = 1
            return e
        c = _ov_cell(ov, -(b + 2), True)
        if c < 0:
            return e
        if bc.ref[b] + ov.vals[c] == 0:
            e += 1
        ov.vals[c] += 1
    ov.sc[OV_CACHED_FREE] -= e
    return e


@njit(cache=True)
def _ov_unref(bc, ov, b):
    """One holder of live block ``b`` lets go; 1 if it becomes free."""
    c = _ov_cell(ov, -(b + 2), True)
    if c < 0:
        return 0
    ov.vals[c] -= 1
    if bc.ref[b] + ov.vals[c] == 0:
        if bc.bhash[b] != NO_HASH or _ov_cell(ov, -(b + 2) - REGISTERED, False) >= 0:
            ov.sc[OV_CACHED_FREE] += 1
        return 1
    return 0


@njit(cache=True)
def ov_release_live(bc, ov, table_row, held):
    """The simulation releases a request holding live blocks (its table);
    returns how many become free."""
    freed = 0
    for i in range(held):
        freed += _ov_unref(bc, ov, table_row[i])
    return freed


@njit(cache=True)
def ov_release_hits(bc, ov, hflat, hoff, hn, rid, k):
    """A request admitted in the simulation lets go of its ``k`` live hit
    blocks; returns how many become free."""
    freed = 0
    for i in range(k):
        freed += _ov_unref(bc, ov, _live_block(bc, ov, block_hash_at(hflat, hoff, hn, rid, i)))
    return freed
