"""KV blocks as the scheduler moves them, in Numba: a free count, or with
prefix caching vLLM's block pool (``block_pool``; SFS's ``block_overlay``
over a live pool): hits, allocation, registration, release, settling
deferred releases. The moves dispatch at compile time on the state's type
(the ``@overload``s at the end): a ``SchedCore`` without prefix-cache
fields gets the count-only forms.

The queue, admission, preemption and finishing moves that use these are
``primitives``.
"""
from __future__ import annotations

from numba import njit
from numba.core import types
from numba.extending import overload

from estimators.engine.block_ids import ids_of
from estimators.engine.block_overlay import (
    OV_CACHED_FREE,
    OV_NPEND,
    find_hit_overlay,
    ov_defer,
    ov_evict,
    ov_register,
    ov_release_hits,
    ov_settle,
    ov_touch,
)
from estimators.engine.block_pool import (
    allocate,
    cache_full,
    evictable_in_hit,
    find_hit,
    free_request,
    num_free,
    touch_hit,
)
from estimators.engine.layout import (
    C_BLOCK,
    C_PREFIX,
    F_BLOCKS,
    F_COMPUTED,
    F_HITB,
    F_NCACHED,
    F_OUTPUTS,
    F_PROMPT,
    F_RID,
    PREFIX_ON,
    PREFIX_OVERLAY,
    S_FREE_BLOCKS,
)

# --- KV blocks: a free count, or vLLM's block pool with its prefix cache (``block_pool``)

@njit(cache=True, inline="always")
def _take_blocks_cached(st, s, hit_blocks, total):
    """Give request ``s`` (holding none) its ``hit_blocks`` cached prefix
    blocks and fresh blocks up to ``total``; the caller has checked that
    they fit. With caching the hit blocks are touched (vLLM:
    ``allocate_new_computed_blocks``), then new ones taken from the head of
    the free queue. In overlay mode (SFS) only counts move, over the live
    cache (``block_overlay.Overlay``)."""
    req, sc, mode = st.req, st.sc, st.cfg[C_PREFIX]
    if mode == PREFIX_ON:
        rid = req[s, F_RID]
        off, n = ids_of(st.hashes, rid)
        touch_hit(st.bc, st.table[s], st.hashes.flat, off, n, rid, hit_blocks)
        allocate(st.bc, st.table[s], hit_blocks, total)
        req[s, F_NCACHED] = hit_blocks
        sc[S_FREE_BLOCKS] = num_free(st.bc)
    elif mode == PREFIX_OVERLAY:
        rid = req[s, F_RID]
        off, n = ids_of(st.hashes, rid)
        ev = ov_touch(st.bc, st.ov, st.hashes.flat, off, n, rid, hit_blocks)
        sc[S_FREE_BLOCKS] -= total - hit_blocks + ev
        req[s, F_NCACHED] = hit_blocks
        req[s, F_HITB] = hit_blocks
        _check_eviction(st)
    else:
        sc[S_FREE_BLOCKS] -= total
    req[s, F_BLOCKS] = total


@njit(cache=True, inline="always")
def _check_eviction(st):
    """Overlay: free blocks without a hash come first in vLLM's free queue;
    an allocation that reaches the cached ones evicts them, oldest first."""
    m = st.ov.sc[OV_CACHED_FREE] - st.sc[S_FREE_BLOCKS]
    if m > 0:
        ov_evict(st.bc, st.ov, m)


@njit(cache=True, inline="always")
def _more_blocks_cached(st, s, need):
    """``need`` more blocks for running request ``s`` (the caller checked the free count)."""
    if st.cfg[C_PREFIX] == PREFIX_ON:
        allocate(st.bc, st.table[s], st.req[s, F_BLOCKS], st.req[s, F_BLOCKS] + need)
        st.sc[S_FREE_BLOCKS] = num_free(st.bc)
    else:
        st.sc[S_FREE_BLOCKS] -= need
        if st.cfg[C_PREFIX] == PREFIX_OVERLAY:
            _check_eviction(st)
    st.req[s, F_BLOCKS] += need


@njit(cache=True, inline="always")
def _register_blocks_cached(st, s):
    """Register ``s``'s blocks filled by the tokens scheduled so far in the
    prefix cache (vLLM's ``cache_blocks`` at schedule time: a later request
    in the same step can hit them); in overlay mode, in the overlay."""
    mode = st.cfg[C_PREFIX]
    if mode == 0:
        return
    req = st.req
    if mode == PREFIX_OVERLAY:
        register_overlay(st.cfg, req, st.ov.sc, st.ov.rng, st.ov.rslots, s)
        return
    nt = req[s, F_PROMPT] + req[s, F_OUTPUTS]
    done = req[s, F_COMPUTED] if req[s, F_COMPUTED] < nt else nt
    full = done // st.cfg[C_BLOCK]
    rid = req[s, F_RID]
    off, n = ids_of(st.hashes, rid)
    req[s, F_NCACHED] = cache_full(st.bc, st.table[s], st.hashes.flat, off, n, rid, req[s, F_NCACHED], full)


@njit(cache=True, inline="always")
def register_overlay(cfg, req, osc, rng, rslots, s):
    """Overlay (SFS): ``s``'s newly filled blocks are registered, as a range
    (``block_overlay.ov_register``), on the arrays (a hot path: a
    decode fills a block every ``block_size`` steps); False if not in
    overlay mode. A live holder's blocks below ``F_NCACHED`` count as cached
    once freed (``ov_release_live``)."""
    on = cfg[C_PREFIX] == PREFIX_OVERLAY
    if on:
        nt = req[s, F_PROMPT] + req[s, F_OUTPUTS]
        done = req[s, F_COMPUTED] if req[s, F_COMPUTED] < nt else nt
        full = done // cfg[C_BLOCK]
        if full > req[s, F_NCACHED]:
            ov_register(osc, rng, rslots, s, req[s, F_RID], req[s, F_NCACHED], full)
            req[s, F_NCACHED] = full
    return on


@njit(cache=True, inline="always")
def release_live_holder(cfg, req, sc, osc, pend, s):
    """Overlay (SFS): free a request that holds live blocks, as counts, on
    the arrays (a hot path: a finishing resident). Its live blocks past its
    cached ones hold no hash and only it has them: free now; the ones
    before may be shared: their release waits until a gate needs it
    (``block_overlay.ov_defer``); blocks the simulation gave it are
    free now, cached if it registered them. False, and nothing done, if
    ``s`` holds no live blocks or the deferral list is full."""
    done = False
    if cfg[C_PREFIX] == PREFIX_OVERLAY and req[s, F_HITB] < 0:  # one exit: Numba then prunes the arrays' refcounts
        live = -req[s, F_HITB] - 1
        nc = req[s, F_NCACHED]
        ncl = nc if nc < live else live
        done = ov_defer(osc, pend, s, ncl)
        if done:
            sc[S_FREE_BLOCKS] += live - ncl + req[s, F_BLOCKS] - live
            if nc > live:
                osc[OV_CACHED_FREE] += nc - live  # registered by the simulation: cached once free
            req[s, F_HITB] = 0
            req[s, F_BLOCKS] = 0
            req[s, F_NCACHED] = 0
    return done


@njit(cache=True, inline="always")
def _release_blocks_cached(st, s):
    """Free ``s``'s blocks (finish or preemption): with caching, tail first
    into vLLM's free queue, where cached ones stay hittable until evicted;
    in overlay mode, as counts (blocks someone else holds stay held)."""
    req, mode = st.req, st.cfg[C_PREFIX]
    if mode == PREFIX_ON:
        free_request(st.bc, st.table[s], req[s, F_BLOCKS])
        st.sc[S_FREE_BLOCKS] = num_free(st.bc)
    elif mode == PREFIX_OVERLAY:
        if req[s, F_HITB] < 0:  # held live blocks (its table), and perhaps more since
            if not release_live_holder(st.cfg, req, st.sc, st.ov.sc, st.ov.pend, s):
                st.sc[S_FREE_BLOCKS] += ov_settle(st.bc, st.ov, st.table)  # the deferral list is full
                release_live_holder(st.cfg, req, st.sc, st.ov.sc, st.ov.pend, s)
            return
        rid = req[s, F_RID]  # admitted in the simulation: its hits are live blocks, the rest its own
        off, n = ids_of(st.hashes, rid)
        k = req[s, F_HITB]
        freed = ov_release_hits(st.bc, st.ov, st.hashes.flat, off, n, rid, k) + req[s, F_BLOCKS] - k
        own = req[s, F_NCACHED] - k
        if own > 0:
            st.ov.sc[OV_CACHED_FREE] += own  # registered by the simulation: cached once free
        st.sc[S_FREE_BLOCKS] += freed
        req[s, F_HITB] = 0
    else:
        st.sc[S_FREE_BLOCKS] += req[s, F_BLOCKS]
    req[s, F_BLOCKS] = 0
    req[s, F_NCACHED] = 0


@njit(cache=True)
def _settle_cached(st):
    """Overlay: carry out the deferred releases (``block_overlay.ov_defer``); False if there were none."""
    if st.cfg[C_PREFIX] != PREFIX_OVERLAY or st.ov.sc[OV_NPEND] == 0:
        return False
    st.sc[S_FREE_BLOCKS] += ov_settle(st.bc, st.ov, st.table)
    return True


@njit(cache=True, inline="always")
def _cached_hit_blocks_cached(st, s, num_tokens):
    """Blocks of ``s``'s longest cached prefix (``get_computed_blocks``: only
    for a request with nothing computed, at most num_tokens - 1 tokens), and
    how many of them sit in the free queue (they count against the free
    blocks in the admission gate). (0, 0) with caching off."""
    mode = st.cfg[C_PREFIX]
    if mode == 0 or st.req[s, F_COMPUTED] != 0:
        return 0, 0
    rid = st.req[s, F_RID]
    off, n = ids_of(st.hashes, rid)
    b = st.cfg[C_BLOCK]
    if mode == PREFIX_ON:
        k = find_hit(st.bc, st.hashes.flat, off, n, rid, num_tokens, b)
        return k, evictable_in_hit(st.bc, st.hashes.flat, off, n, rid, k)
    return find_hit_overlay(st.bc, st.ov, st.hashes, off, n, rid, num_tokens, b)


# --- the KV-block moves on a state without prefix-cache fields
#
# A state tuple is copied (an incref and decref of every array in it) at
# every non-inlined call and every inlined helper that takes it, and every
# array of it is unboxed on entry from Python. SFS with caching off runs the
# kernel on a ``SchedCore`` scratch state (the six scheduler arrays), as
# before prefix caching existed; these moves dispatch at compile time on
# the state's type: a ``SchedCore`` gets the count-only forms.


def _core(st) -> bool:
    return isinstance(st, types.BaseNamedTuple) and "bc" not in st.fields


def take_blocks(st, s, hit_blocks, total):
    """Give request ``s`` (holding none) its ``hit_blocks`` cached prefix blocks
    and fresh blocks up to ``total`` (``_take_blocks_cached``)."""
    raise NotImplementedError  # compiled only


def more_blocks(st, s, need):
    """``need`` more blocks for running request ``s`` (``_more_blocks_cached``)."""
    raise NotImplementedError


def register_blocks(st, s):
    """Register ``s``'s filled blocks in the prefix cache (``_register_blocks_cached``)."""
    raise NotImplementedError


def release_blocks(st, s):
    """Free ``s``'s blocks (``_release_blocks_cached``)."""
    raise NotImplementedError


def cached_hit_blocks(st, s, num_tokens):
    """Blocks of ``s``'s longest cached prefix and how many are evictable
    (``_cached_hit_blocks_cached``)."""
    raise NotImplementedError


def ov_lists(st):
    """The overlay's scalars and deferral list, for the hot loops that take
    arrays (a ``SchedCore`` has none: its ``sc`` twice, never read, since
    its caching is off)."""
    raise NotImplementedError


def ov_register_parts(st):
    """What ``register_overlay`` reads besides ``cfg`` and ``req``: the
    overlay's scalars and ranges (a ``SchedCore``: arrays of its own, never
    read)."""
    raise NotImplementedError


def settle(st):
    """Before a KV gate refuses: carry out deferred releases; True if there
    were any (the caller checks again). ``_settle_cached``."""
    raise NotImplementedError


@overload(take_blocks, inline="always")
def _ov_take_blocks(st, s, hit_blocks, total):
    if _core(st):
        def impl(st, s, hit_blocks, total):
            st.sc[S_FREE_BLOCKS] -= total
            st.req[s, F_BLOCKS] = total
        return impl
    return lambda st, s, hit_blocks, total: _take_blocks_cached(st, s, hit_blocks, total)


@overload(more_blocks, inline="always")
def _ov_more_blocks(st, s, need):
    if _core(st):
        def impl(st, s, need):
            st.sc[S_FREE_BLOCKS] -= need
            st.req[s, F_BLOCKS] += need
        return impl
    return lambda st, s, need: _more_blocks_cached(st, s, need)


@overload(register_blocks, inline="always")
def _ov_register_blocks(st, s):
    if _core(st):
        return lambda st, s: None
    return lambda st, s: _register_blocks_cached(st, s)


@overload(release_blocks)  # not inlined: inlining it twice trips Numba's SSA check (NumbaIRAssumptionWarning)
def _ov_release_blocks(st, s):
    if _core(st):
        def impl(st, s):
            st.sc[S_FREE_BLOCKS] += st.req[s, F_BLOCKS]
            st.req[s, F_BLOCKS] = 0
            st.req[s, F_NCACHED] = 0
        return impl
    return lambda st, s: _release_blocks_cached(st, s)


@overload(cached_hit_blocks, inline="always")
def _ov_cached_hit_blocks(st, s, num_tokens):
    if _core(st):
        return lambda st, s, num_tokens: (0, 0)
    return lambda st, s, num_tokens: _cached_hit_blocks_cached(st, s, num_tokens)


@overload(settle)
def _ov_settle(st):
    if _core(st):
        return lambda st: False
    return lambda st: _settle_cached(st)


@overload(ov_lists, inline="always")
def _ov_ov_lists(st):
    if _core(st):
        return lambda st: (st.sc, st.sc)
    return lambda st: (st.ov.sc, st.ov.pend)


@overload(ov_register_parts, inline="always")
def _ov_ov_register_parts(st):
    if _core(st):
        return lambda st: (st.sc, st.req, st.sc)
    return lambda st: (st.ov.sc, st.ov.rng, st.ov.rslots)
