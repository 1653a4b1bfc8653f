"""The per-request moves the scheduler's policies (``kernel``) are written
in, in Numba: growing a running request's blocks (preempting the tail of
``running`` when they run out, or under priority scheduling the running
request of the largest priority and arrival), putting a request in the batch, its
prefix-cache hit at admission, admitting, refusing the head of ``waiting``.
Fast forms take the arrays (the hot loops), slow ones the whole state.
"""
from __future__ import annotations

from numba import njit

from estimators.engine.block_overlay import OV_CACHED_FREE
from estimators.engine.kv_blocks import (
    cached_hit_blocks,
    more_blocks,
    register_blocks,
    settle,
)
from estimators.engine.layout import (
    C_BLOCK,
    C_PREFIX,
    EV_REJECT,
    F_ARRIVAL,
    F_BLOCKS,
    F_COMPUTED,
    F_EVENT,
    F_HIT,
    F_OUTPUTS,
    F_PH,
    F_PREEMPTIONS,
    F_PRIO,
    F_PROMPT,
    F_RID,
    F_STATUS,
    PREFIX_OFF,
    PREFIX_OVERLAY,
    S_FREE_BLOCKS,
    S_NPREEMPT,
    S_NR,
    ST_REJECTED,
)
from estimators.engine.primitives import (
    admit,
    cdiv,
    preempt,
    wait_pop_front,
)


@njit(cache=True, inline="always")
def _preempt_tail(st, plan):
    """Recompute preemption of the last running request; returns its slot."""
    v = st.running[st.sc[S_NR] - 1]
    preempt(st, v)
    plan.preempted[st.sc[S_NPREEMPT] - 1] = v
    return v


@njit(cache=True, inline="always")
def _grow_blocks(st, plan, s, n):
    """Give running request ``s`` blocks for ``n`` more tokens, preempting
    the tail of ``running`` as needed. False if ``s`` preempted itself."""
    req, sc = st.req, st.sc
    need = cdiv(req[s, F_COMPUTED] + n, st.cfg[C_BLOCK]) - req[s, F_BLOCKS]
    while need > sc[S_FREE_BLOCKS]:
        if settle(st):  # deferred releases first (SFS's overlay): they may be enough
            continue
        v = _preempt_tail(st, plan)
        if v == s:
            return False
    if need > 0:
        more_blocks(st, s, need)
    return True


@njit(cache=True, inline="always")
def _victim(req, sc, running):
    """Priority scheduling: the request to preempt, vLLM's ``max(running,
    key=(priority, arrival_time))``: the largest key, the first in running
    order among equals (no request-id tie-break here, unlike waiting's)."""
    v = running[0]
    for r in range(1, sc[S_NR]):
        x = running[r]
        if req[x, F_PRIO] > req[v, F_PRIO] or (req[x, F_PRIO] == req[v, F_PRIO]
                                               and req[x, F_ARRIVAL] > req[v, F_ARRIVAL]):
            v = x
    return v


@njit(cache=True, inline="always")
def _unput(plan, k, j):
    """Drop item ``j`` of the first ``k`` in the batch (order of the rest
    kept); returns its tokens."""
    n = plan.tokens[j]
    for m in range(j + 1, k):
        plan.slot[m - 1] = plan.slot[m]
        plan.tokens[m - 1] = plan.tokens[m]
        plan.computed[m - 1] = plan.computed[m]
        plan.rid[m - 1] = plan.rid[m]
        plan.samples[m - 1] = plan.samples[m]
        plan.preemptions[m - 1] = plan.preemptions[m]
    return n


@njit(cache=True)
def _grow_priority(st, plan, s, n, i, k):
    """``_grow_blocks`` under priority scheduling (vLLM 0.32's PRIORITY
    branch of ``schedule()``'s first pass): each victim is ``_victim``, not
    the tail; a victim already in this step's batch leaves it and gives its
    tokens back to the budget, and one ahead of ``s`` in running moves
    ``s``'s index ``i`` down. Returns (``s`` still runs, ``i``, the batch's
    size ``k``, tokens given back)."""
    req, sc, running = st.req, st.sc, st.running
    need = cdiv(req[s, F_COMPUTED] + n, st.cfg[C_BLOCK]) - req[s, F_BLOCKS]
    back = 0
    while need > sc[S_FREE_BLOCKS]:
        if settle(st):  # deferred releases first (SFS's overlay): they may be enough
            continue
        v = _victim(req, sc, running)
        for r in range(i):
            if running[r] == v:
                i -= 1
                break
        for j in range(k):
            if plan.slot[j] == v:
                back += _unput(plan, k, j)
                k -= 1
                break
        preempt(st, v)
        plan.preempted[sc[S_NPREEMPT] - 1] = v
        if v == s:
            return False, i, k, back
    if need > 0:
        more_blocks(st, s, need)
    return True, i, k, back


@njit(cache=True, inline="always")
def _grow_fast(cfg, req, sc, osc, s, n):
    """``_grow_blocks`` without ``st`` in the usual cases: no block needed,
    or the blocks fit with caching off, or in SFS's overlay without
    reaching a cached block (no eviction: only counts move). False: the
    caller runs ``_grow_slow``.

    The hot paths call only array-taking helpers with caching off: an
    inlined helper taking ``st`` copies the tuple, an incref and decref of
    every array in it (21 with the prefix-cache bundles) that LLVM does not
    prune, per resident per step."""
    need = cdiv(req[s, F_COMPUTED] + n, cfg[C_BLOCK]) - req[s, F_BLOCKS]
    if need <= 0:
        return True
    if need <= sc[S_FREE_BLOCKS] and (cfg[C_PREFIX] == PREFIX_OFF or (
            cfg[C_PREFIX] == PREFIX_OVERLAY and osc[OV_CACHED_FREE] <= sc[S_FREE_BLOCKS] - need)):
        sc[S_FREE_BLOCKS] -= need
        req[s, F_BLOCKS] += need
        return True
    return False


@njit(cache=True, inline="always")
def _needs_blocks(block, computed, n, blocks):
    """``n`` more tokens need a new block (decodes: once per ``block``
    tokens). Scalars only: the grow helpers take arrays, and an inlined
    helper handed arrays increfs and decrefs each at every call, which the
    per-resident loops cannot afford."""
    return cdiv(computed + n, block) > blocks


@njit(cache=True)
def _grow_slow(st, plan, s, n):
    """``_grow_blocks`` out of line: the hot loops stay small."""
    return _grow_blocks(st, plan, s, n)


@njit(cache=True)
def _register_slow(st, s):
    """``register_blocks`` out of line (caching on only)."""
    register_blocks(st, s)


@njit(cache=True, inline="always")
def _fills(block, prompt, outputs, computed, ncached):
    """The tokens scheduled fill a block not registered yet (decodes do once
    per block): only then is a block registered. Scalars only: an inlined
    helper handed an array increfs and decrefs it at every call."""
    nt = prompt + outputs
    done = computed if computed < nt else nt
    return done // block > ncached




@njit(cache=True, inline="always")
def _put(req, plan, k, s, n):
    """Item ``k`` of the batch: ``n`` tokens of ``s`` (with caching on the
    caller then registers its filled blocks, ``_register_slow``)."""
    plan.slot[k] = s
    plan.tokens[k] = n
    plan.computed[k] = req[s, F_COMPUTED]
    req[s, F_COMPUTED] += n
    return k + 1


@njit(cache=True, inline="always")
def _place(req, plan, j, s):
    """Async scheduling, after ``_put`` of item ``j``: a request whose
    scheduled tokens reach its known tokens plus placeholders (not a prefill
    chunk) samples a token in this step, so it gets a placeholder for it
    (``AsyncScheduler._update_after_schedule``); the item remembers its
    request, whether it samples and the request's preemptions so far, for
    when its outputs are applied (a preemption in between makes them stale)."""
    samples = req[s, F_COMPUTED] >= req[s, F_PROMPT] + req[s, F_OUTPUTS] + req[s, F_PH]
    plan.rid[j] = req[s, F_RID]
    plan.samples[j] = 1 if samples else 0
    plan.preemptions[j] = req[s, F_PREEMPTIONS]
    if samples:
        req[s, F_PH] += 1


@njit(cache=True, inline="always")
def _at_max_tokens_in_flight(placeholders, computed, prompt, max_tokens):
    """Async scheduling: the tokens in flight already take the request to
    max_tokens, so no further step is planned for it (vLLM's
    ``num_computed_tokens + 2 - num_output_placeholders >= P + max_tokens``).
    Scalars only: the per-resident loop cannot afford an array's incref."""
    return placeholders > 0 and computed + 2 - placeholders >= prompt + max_tokens


@njit(cache=True, inline="always")
def _given_hit(cfg, req, s, num_tokens):
    """Prefix-cache hit on admission with caching off: a hit given with the
    request (``F_HIT``, e.g. from a trace), block aligned and at most
    num_tokens - 1, whose blocks are counted as new: (hit blocks, -1)."""
    if req[s, F_COMPUTED] != 0 or req[s, F_HIT] <= 0:
        return 0, 0
    b = cfg[C_BLOCK]
    cap = (num_tokens - 1) // b
    hit = req[s, F_HIT] // b
    return (hit if hit < cap else cap), -1  # -1: not cached blocks, all allocated


@njit(cache=True)
def _hit(st, s, num_tokens):
    """Prefix-cache hit on admission with caching on (vLLM's lookup in the
    instance's cache), out of line: (hit blocks, of which evictable)."""
    return cached_hit_blocks(st, s, num_tokens)


@njit(cache=True)
def _admit(st, hit_blocks, blocks, computed):
    """``admit`` with caching on, out of line."""
    return admit(st, hit_blocks, blocks, computed)


@njit(cache=True)
def _reject_head(st):
    """Refuse the head of ``waiting`` outright (status REJECTED); returns its slot."""
    s = wait_pop_front(st.sc, st.waiting)
    st.req[s, F_STATUS] = ST_REJECTED
    st.req[s, F_EVENT] = EV_REJECT
    return s
