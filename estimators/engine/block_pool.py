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

Why an open-addressing table (each cell's key and block side by side: a
lookup reads one cache line, and a warm cache's table is larger than L2): lookups and inserts are O(1) with no
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
    # tail first: cached blocks whose count drops to 0 go to the queue's tail in that order
    for i in range(held - 1, -1, -1):
        b = table_row[i]
        ref[b] -= 1
        if ref[b] == 0 and bhash[b] != NO_HASH:
            _fq_insert_after(fprev, fnext, fbits, sc, fprev[tail], b)
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
    ``sc[OV_FALLBACK]`` and SFS reruns on a full copy (``sfs_kernel``)."""

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
