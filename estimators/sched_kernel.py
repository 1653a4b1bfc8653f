"""The scheduler kernel: one step of an instance's scheduler, over the plain
arrays of ``sched_state``. It is the only implementation of the scheduling
rules; the engine twin and SFS both call it.

Policies (``../shared/reference/vllm_v1_scheduler.md``):

- ``vllm-v1`` (vLLM 0.32/0.33 V1, FCFS, sync scheduling): pass 1 walks
  ``running`` in admission order giving each request what it lacks (capped
  by ``long_prefill_token_threshold`` when more than one request is
  eligible, by the token budget and by max_model_len - computed - 1); when
  KV blocks run out it preempts the tail of ``running`` (recompute: blocks
  freed, computed reset, pushed to the front of ``waiting``) and stops the
  pass if it had to preempt the request itself. Pass 2 runs only when
  nothing was preempted: admit from the head of ``waiting`` while the
  budget lasts and ``len(running) < max_num_seqs``, each admission needing
  blocks for its whole current sequence; the first refusal stops the pass.
- ``sarathi``: decodes first (one token each, preempting the tail of
  ``running`` for blocks), then ongoing prefills, then new requests FCFS;
  whole-sequence blocks at admission with a 1% watermark.
- ``vllm-v0`` (chunked prefill off): if any waiting prompt can be admitted
  whole (token budget, ``max_num_seqs``, blocks + 1% watermark), the step
  is prefill-only; otherwise every running request decodes one token,
  preempting the tail for blocks.

``schedule_step`` mutates the state as vLLM does at schedule time
(computed tokens advance, blocks are allocated, queues move) and writes the
batch to ``out_slot/out_tok/out_cb`` (slot, tokens, computed before);
``complete_step`` applies the step's outputs: a request whose computed
tokens reach its token count samples a token; at its target length it
finishes, frees its blocks and its slot.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from estimators.sched_state import (
    C_BLOCK,
    C_BUDGET,
    C_CHUNKED,
    C_LONG_PREFILL,
    C_MAX_LEN,
    C_MAX_SEQS,
    C_POLICY,
    C_WATERMARK,
    EV_FINISH,
    EV_FIRST,
    F_BLOCKS,
    F_COMPUTED,
    F_EVENT,
    F_HIT,
    F_OUTPUTS,
    F_PREEMPTIONS,
    F_PROMPT,
    F_STATUS,
    F_TARGET,
    S_CAP,
    S_FREE_BLOCKS,
    S_NFREE_SLOTS,
    S_NPREEMPT,
    S_NR,
    S_STEP,
    S_WHEAD,
    S_WN,
    ST_FINISHED,
    ST_REJECTED,
    ST_RUNNING,
    ST_WAITING,
)

EV_REJECT = 4


@njit(cache=True, inline="always")
def cdiv(a, b):
    return -(-a // b)


@njit(cache=True, inline="always")
def _wait_head(sc, waiting):
    return waiting[sc[S_WHEAD]]


@njit(cache=True, inline="always")
def _wait_pop_front(sc, waiting):
    s = waiting[sc[S_WHEAD]]
    sc[S_WHEAD] = (sc[S_WHEAD] + 1) % sc[S_CAP]
    sc[S_WN] -= 1
    return s


@njit(cache=True, inline="always")
def _wait_push_front(sc, waiting, s):
    sc[S_WHEAD] = (sc[S_WHEAD] - 1 + sc[S_CAP]) % sc[S_CAP]
    waiting[sc[S_WHEAD]] = s
    sc[S_WN] += 1


@njit(cache=True, inline="always")
def wait_push_back(sc, waiting, s):
    waiting[(sc[S_WHEAD] + sc[S_WN]) % sc[S_CAP]] = s
    sc[S_WN] += 1


@njit(cache=True)
def _preempt_tail(req, sc, running, waiting):
    """Recompute preemption of the last running request; returns its slot."""
    sc[S_NR] -= 1
    v = running[sc[S_NR]]
    sc[S_FREE_BLOCKS] += req[v, F_BLOCKS]
    req[v, F_BLOCKS] = 0
    req[v, F_COMPUTED] = 0
    req[v, F_STATUS] = ST_WAITING
    req[v, F_PREEMPTIONS] += 1
    _wait_push_front(sc, waiting, v)
    sc[S_NPREEMPT] += 1
    return v


@njit(cache=True)
def _grow_blocks(cfg, req, sc, running, waiting, s, n):
    """Give running request ``s`` blocks for ``n`` more tokens, preempting
    the tail of ``running`` as needed. False if ``s`` preempted itself."""
    need = cdiv(req[s, F_COMPUTED] + n, cfg[C_BLOCK]) - req[s, F_BLOCKS]
    while need > sc[S_FREE_BLOCKS]:
        v = _preempt_tail(req, sc, running, waiting)
        if v == s:
            return False
    if need > 0:
        sc[S_FREE_BLOCKS] -= need
        req[s, F_BLOCKS] += need
    return True


@njit(cache=True, inline="always")
def _emit(req, out_slot, out_tok, out_cb, k, s, n):
    out_slot[k] = s
    out_tok[k] = n
    out_cb[k] = req[s, F_COMPUTED]
    req[s, F_COMPUTED] += n
    return k + 1


@njit(cache=True)
def _admit(req, sc, running, waiting, blocks, computed):
    """Pop the head of ``waiting`` into the tail of ``running``."""
    s = _wait_pop_front(sc, waiting)
    running[sc[S_NR]] = s
    sc[S_NR] += 1
    req[s, F_STATUS] = ST_RUNNING
    req[s, F_COMPUTED] = computed
    req[s, F_BLOCKS] = blocks
    sc[S_FREE_BLOCKS] -= blocks
    return s


@njit(cache=True, inline="always")
def _hit_tokens(cfg, req, s, num_tokens):
    """Prefix-cache hit on admission: block aligned, at most num_tokens - 1."""
    if req[s, F_COMPUTED] != 0 or req[s, F_HIT] <= 0:
        return 0
    b = cfg[C_BLOCK]
    cap = ((num_tokens - 1) // b) * b
    hit = (req[s, F_HIT] // b) * b
    return hit if hit < cap else cap


@njit(cache=True)
def _schedule_v1(cfg, req, sc, running, waiting, out_slot, out_tok, out_cb):
    budget = cfg[C_BUDGET]
    b = cfg[C_BLOCK]
    max_len = cfg[C_MAX_LEN]
    cap = cfg[C_LONG_PREFILL] if sc[S_NR] + sc[S_WN] > 1 else 0
    k = 0
    i = 0
    while i < sc[S_NR] and budget > 0:
        s = running[i]
        n = req[s, F_PROMPT] + req[s, F_OUTPUTS] - req[s, F_COMPUTED]
        if 0 < cap < n:
            n = cap
        if n > budget:
            n = budget
        lim = max_len - req[s, F_COMPUTED] - 1
        if n > lim:
            n = lim
        if n <= 0:
            i += 1
            continue
        if not _grow_blocks(cfg, req, sc, running, waiting, s, n):
            break
        k = _emit(req, out_slot, out_tok, out_cb, k, s, n)
        budget -= n
        i += 1
    if sc[S_NPREEMPT] > 0:
        return k
    while budget > 0 and sc[S_WN] > 0:
        if sc[S_NR] >= cfg[C_MAX_SEQS]:
            break
        s = _wait_head(sc, waiting)
        num_tokens = req[s, F_PROMPT] + req[s, F_OUTPUTS]
        hit = _hit_tokens(cfg, req, s, num_tokens)
        n = num_tokens - hit
        if 0 < cap < n:
            n = cap
        if cfg[C_CHUNKED] == 0 and n > budget:
            break
        if n > budget:
            n = budget
        full = num_tokens if num_tokens < max_len else max_len
        watermark = cfg[C_WATERMARK] if sc[S_NR] > 0 else 0
        if cdiv(full, b) + watermark > sc[S_FREE_BLOCKS]:
            break  # the whole current sequence must fit; no one behind the head is tried
        s = _admit(req, sc, running, waiting, cdiv(hit + n, b), hit)
        k = _emit(req, out_slot, out_tok, out_cb, k, s, n)
        budget -= n
    return k


@njit(cache=True)
def _schedule_sarathi(cfg, req, sc, running, waiting, out_slot, out_tok, out_cb):
    budget = cfg[C_BUDGET]
    b = cfg[C_BLOCK]
    k = 0
    # 1. decodes first, in running order
    i = 0
    while i < sc[S_NR] and budget > 0:
        s = running[i]
        remaining = req[s, F_PROMPT] + req[s, F_OUTPUTS] - req[s, F_COMPUTED]
        if remaining != 1 or req[s, F_COMPUTED] < req[s, F_PROMPT]:
            i += 1
            continue
        if not _grow_blocks(cfg, req, sc, running, waiting, s, 1):
            continue  # preempted itself; running shrank, i now points past the end
        k = _emit(req, out_slot, out_tok, out_cb, k, s, 1)
        budget -= 1
        i += 1
    # 2. ongoing prefills, in running order
    i = 0
    while i < sc[S_NR] and budget > 0:
        s = running[i]
        remaining = req[s, F_PROMPT] + req[s, F_OUTPUTS] - req[s, F_COMPUTED]
        if remaining > 0 and not (remaining == 1 and req[s, F_COMPUTED] >= req[s, F_PROMPT]):
            n = remaining if remaining < budget else budget
            if _grow_blocks(cfg, req, sc, running, waiting, s, n):
                k = _emit(req, out_slot, out_tok, out_cb, k, s, n)
                budget -= n
            else:
                continue
        i += 1
    # 3. new requests, FCFS; the whole sequence is allocated at admission
    while budget > 0 and sc[S_WN] > 0:
        if sc[S_NR] >= cfg[C_MAX_SEQS]:
            break
        s = _wait_head(sc, waiting)
        num_tokens = req[s, F_PROMPT] + req[s, F_OUTPUTS]
        full = cdiv(num_tokens, b)
        if sc[S_FREE_BLOCKS] - full < cfg[C_WATERMARK]:
            break
        hit = _hit_tokens(cfg, req, s, num_tokens)
        n = num_tokens - hit
        if n > budget:
            n = budget
        s = _admit(req, sc, running, waiting, full, hit)
        k = _emit(req, out_slot, out_tok, out_cb, k, s, n)
        budget -= n
    return k


@njit(cache=True)
def _schedule_v0(cfg, req, sc, running, waiting, out_slot, out_tok, out_cb, rejected):
    budget = cfg[C_BUDGET]
    b = cfg[C_BLOCK]
    limit = cfg[C_MAX_LEN] if cfg[C_MAX_LEN] < budget else budget
    k = 0
    used = 0
    while sc[S_WN] > 0:
        s = _wait_head(sc, waiting)
        num_tokens = req[s, F_PROMPT] + req[s, F_OUTPUTS]
        if num_tokens > limit:  # V0 ignores such prompts with an error
            _wait_pop_front(sc, waiting)
            req[s, F_STATUS] = ST_REJECTED
            req[s, F_EVENT] = EV_REJECT
            rejected[0] += 1
            rejected[rejected[0]] = s
            continue
        if used + num_tokens > budget or sc[S_NR] + 1 > cfg[C_MAX_SEQS]:
            break
        full = cdiv(num_tokens, b)
        if sc[S_FREE_BLOCKS] - full < cfg[C_WATERMARK]:
            break
        hit = _hit_tokens(cfg, req, s, num_tokens)
        s = _admit(req, sc, running, waiting, full, hit)
        k = _emit(req, out_slot, out_tok, out_cb, k, s, num_tokens - hit)
        used += num_tokens - hit
    if k > 0:
        return k  # prefill-only step
    i = 0
    while i < sc[S_NR]:
        s = running[i]
        if not _grow_blocks(cfg, req, sc, running, waiting, s, 1):
            continue
        k = _emit(req, out_slot, out_tok, out_cb, k, s, 1)
        i += 1
    return k


@njit(cache=True)
def schedule_step(cfg, req, sc, running, waiting, out_slot, out_tok, out_cb, rejected):
    """Schedule one step; returns the number of requests in the batch.

    ``rejected[0]`` counts and ``rejected[1:]`` lists slots refused outright
    (V0: prompts longer than the budget); the caller resets ``rejected[0]``.
    """
    sc[S_NPREEMPT] = 0
    sc[S_STEP] += 1
    policy = cfg[C_POLICY]
    if policy == 0:
        return _schedule_v1(cfg, req, sc, running, waiting, out_slot, out_tok, out_cb)
    if policy == 1:
        return _schedule_sarathi(cfg, req, sc, running, waiting, out_slot, out_tok, out_cb)
    return _schedule_v0(cfg, req, sc, running, waiting, out_slot, out_tok, out_cb, rejected)


@njit(cache=True)
def complete_step(req, sc, running, free_slots, out_slot, n):
    """Apply the outputs of a step that scheduled ``out_slot[:n]``.

    Sets ``req[s, F_EVENT]`` (EV_FIRST, EV_FINISH) for every scheduled slot;
    finished requests leave ``running`` and their slots are recycled (their
    rows stay readable until the slot is reused)."""
    finished = 0
    for j in range(n):
        s = out_slot[j]
        req[s, F_EVENT] = 0
        if req[s, F_COMPUTED] >= req[s, F_PROMPT] + req[s, F_OUTPUTS]:
            req[s, F_OUTPUTS] += 1
            if req[s, F_OUTPUTS] == 1:
                req[s, F_EVENT] |= EV_FIRST
            if req[s, F_OUTPUTS] >= req[s, F_TARGET]:
                req[s, F_EVENT] |= EV_FINISH
                req[s, F_STATUS] = ST_FINISHED
                sc[S_FREE_BLOCKS] += req[s, F_BLOCKS]
                req[s, F_BLOCKS] = 0
                free_slots[sc[S_NFREE_SLOTS]] = s
                sc[S_NFREE_SLOTS] += 1
                finished += 1
    if finished > 0:
        w = 0
        for r in range(sc[S_NR]):
            s = running[r]
            if req[s, F_STATUS] == ST_RUNNING:
                running[w] = s
                w += 1
        sc[S_NR] = w
    return finished


@njit(cache=True)
def drop_unservable_head(req, sc, waiting):
    """Nothing runs and the head of ``waiting`` still cannot be admitted: it
    needs more KV than the instance has and would block the queue forever.
    Refuse it (status REJECTED) and return its slot; the caller frees it."""
    s = waiting[sc[S_WHEAD]]
    sc[S_WHEAD] = (sc[S_WHEAD] + 1) % sc[S_CAP]
    sc[S_WN] -= 1
    req[s, F_STATUS] = ST_REJECTED
    req[s, F_EVENT] = EV_REJECT
    return s


def new_batch_buffers(capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """out_slot, out_tok, out_cb and rejected arrays for ``capacity`` slots."""
    return (np.zeros(capacity, dtype=np.int64), np.zeros(capacity, dtype=np.int64),
            np.zeros(capacity, dtype=np.int64), np.zeros(capacity + 1, dtype=np.int64))
