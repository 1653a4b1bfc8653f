"""The block cache kernel against an independent transcription of vLLM's
BlockPool: random operation sequences must give the same hits, evictions,
free counts, free-queue order, map contents and block tables."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from estimators.engine import block_pool as bk
from estimators.engine.block_ids import OWN_BASE, OWN_BLOCK_BITS
from tests.estimators.engine.block_pool_reference import RefBlockPool

B = 4  # tokens per block: small, so that sequences span many blocks


def cdiv(a, b):
    return -(-a // b)


class Req:
    def __init__(self, rid, shared, length):
        self.rid, self.shared, self.length = rid, np.array(shared, dtype=np.int64), length
        self.computed = 0
        self.held = 0
        self.n_cached = 0
        self.table = np.zeros(cdiv(length, B) + 1, dtype=np.int64)
        self.ref_blocks: list[int] = []

    def hashes(self):
        n = self.length // B
        return [int(self.shared[i]) if i < len(self.shared) else OWN_BASE + (self.rid << OWN_BLOCK_BITS) + i
                for i in range(n)]


def check_same(bc, ref):
    assert bk.num_free(bc) == ref.num_free()
    assert bk.free_queue_order(bc) == ref.free_queue
    assert bk.cached_map(bc) == {h: list(bs) for h, bs in ref.map.items()}
    assert list(bc.ref) == ref.ref
    assert int(bc.sc[bk.B_EVICTIONS]) == ref.evictions
    queue = ref.free_queue
    cached = [b for b in queue if ref.hash[b] is not None]
    assert int(bc.sc[bk.B_NFREE_CACHED]) == len(cached)
    assert queue[len(queue) - len(cached):] == cached  # blocks without a hash always come first
    n = len(ref.ref)
    bits = [bool((int(bc.fbits[b >> 6]) >> (b & 63)) & 1) for b in range(n)]
    assert bits == [b in set(queue) for b in range(n)]  # the free-block bitmap is the free queue's membership


def admit(bc, ref, r, chunk):
    """Admission as vLLM's scheduler does it: hit, whole-sequence gate, touch, allocate, register."""
    hit = bk.find_hit(bc, r.shared, 0, len(r.shared), r.rid, r.length, B)
    ref_hit = ref.find_hit(r.hashes(), r.length, B)
    assert hit == len(ref_hit)
    ev = bk.evictable_in_hit(bc, r.shared, 0, len(r.shared), r.rid, hit)
    assert ev == sum(ref.ref[b] == 0 for b in ref_hit)
    if cdiv(r.length, B) - hit + ev > bk.num_free(bc):
        return
    n = min(chunk, r.length - hit * B)
    bk.touch_hit(bc, r.table, r.shared, 0, len(r.shared), r.rid, hit)
    ref.touch(ref_hit)
    r.held = bk.allocate(bc, r.table, hit, cdiv(hit * B + n, B))
    r.ref_blocks = ref_hit + ref.get_new_blocks(cdiv(hit * B + n, B) - hit)
    r.computed = hit * B + n
    register(bc, ref, r, hit)


def register(bc, ref, r, n_cached):
    n_full = r.computed // B
    r.n_cached = bk.cache_full(bc, r.table, r.shared, 0, len(r.shared), r.rid, n_cached, n_full)
    ref.cache_full_blocks(r.ref_blocks, r.hashes(), n_cached, n_full)
    assert list(r.table[: r.held]) == r.ref_blocks


def grow(bc, ref, r, chunk):
    n = min(chunk, r.length - r.computed)
    if n <= 0:
        return
    need = cdiv(r.computed + n, B) - r.held
    if need > bk.num_free(bc):
        return
    r.held = bk.allocate(bc, r.table, r.held, r.held + need)
    r.ref_blocks += ref.get_new_blocks(need)
    r.computed += n
    register(bc, ref, r, r.n_cached)


def free(bc, ref, r):
    bk.free_request(bc, r.table, r.held)
    ref.free_blocks(list(reversed(r.ref_blocks)))
    r.held, r.computed, r.n_cached, r.ref_blocks = 0, 0, 0, []


ops = st.lists(st.tuples(st.sampled_from(["admit", "grow", "free"]), st.integers(0, 7), st.integers(1, 20)),
               min_size=1, max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=ops, num_blocks=st.integers(4, 24), seed=st.integers(0, 2**16))
def test_kernel_matches_reference(ops, num_blocks, seed):
    rng = np.random.default_rng(seed)
    bc, ref = bk.new_block_cache(num_blocks), RefBlockPool(num_blocks)
    families = [[1000 * f + i for i in range(6)] for f in range(2)]
    reqs = []
    for rid in range(8):  # lengths often whole blocks, so that hits are capped and blocks computed twice
        length = int(rng.integers(1, 30)) if rng.random() < 0.5 else B * int(rng.integers(1, 7))
        shared = families[int(rng.integers(0, 2))][: int(rng.integers(0, 7))][: length // B]
        reqs.append(Req(rid, shared, length))
    for kind, i, chunk in ops:
        r = reqs[i]
        if kind == "admit" and r.held == 0:
            admit(bc, ref, r, chunk)
        elif kind == "grow" and r.held > 0:
            grow(bc, ref, r, chunk)
        elif kind == "free" and r.held > 0:
            free(bc, ref, r)
        check_same(bc, ref)


def test_same_step_hit_and_resume_hits_own_blocks():
    """A request registered at schedule time is hit by the next admission;
    a freed request later hits its own blocks, outputs included."""
    bc = bk.new_block_cache(32)
    shared = np.array([7, 8, 9], dtype=np.int64)
    a = Req(0, shared, 22)  # 5 full blocks: 3 shared + 2 own
    bc_ref = RefBlockPool(32)
    admit(bc, bc_ref, a, 22)
    b = Req(1, shared, 14)
    assert bk.find_hit(bc, b.shared, 0, 3, 1, b.length, B) == 3
    free(bc, bc_ref, a)
    assert bk.find_hit(bc, a.shared, 0, 3, 0, 22, B) == 5  # its own blocks survive the free
    assert bk.find_hit(bc, a.shared, 0, 3, 0, 20, B) == 4  # capped at num_tokens - 1


def test_eviction_is_lru_and_frees_hashless_blocks_first():
    bc, ref = bk.new_block_cache(6), RefBlockPool(6)  # 5 usable blocks
    a = Req(0, [1, 2], 10)  # 3 blocks: 2 full hashed, 1 partial without hash
    admit(bc, ref, a, 10)
    free(bc, ref, a)
    order = bk.free_queue_order(bc)
    assert order[0] == a.table[2]  # the partial block goes to the front
    assert order[-2:] == [a.table[1], a.table[0]]  # the chain's tail is evicted before its head
    c = Req(1, [], 20)  # needs all 5 blocks: evicts both cached ones
    admit(bc, ref, c, 20)
    assert 1 not in bk.cached_map(bc) and 2 not in bk.cached_map(bc)
    assert int(bc.sc[bk.B_EVICTIONS]) == 2


def test_hash_table_survives_churn():
    """Registrations and evictions at full load of a large pool (long probe
    runs, backward-shift deletions) keep every lookup right."""
    rng = np.random.default_rng(3)
    n = 512
    bc = bk.new_block_cache(n)
    owner: dict[int, list[int]] = {}
    block_key = {}
    for _ in range(6000):
        b = int(rng.integers(1, n))
        if b in block_key:
            key = block_key.pop(b)
            bk._evict_hash(bc, b)
            owner[key].remove(b)
            if not owner[key]:
                del owner[key]
        else:
            key = int(rng.integers(0, 300))  # few keys: many duplicates and collisions
            bk._insert_hash(bc, key, b)
            block_key[b] = key
            owner.setdefault(key, []).append(b)
        for key in rng.integers(0, 300, 5):
            assert bk.lookup(bc, int(key)) == (owner[int(key)][0] if int(key) in owner else -1)
    assert bk.cached_map(bc) == owner
