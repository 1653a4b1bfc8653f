"""The scheduler kernel: one step of an instance's scheduler, over a
``SchedState`` bundle. It is the only implementation of the scheduling
rules; the engine twin and SFS both call it.

Policies (vLLM 0.32's ``vllm/v1/core/sched/scheduler.py``,
https://github.com/vllm-project/vllm/blob/v0.32.0/vllm/v1/core/sched/scheduler.py):

- ``vllm-v1`` (vLLM 0.32/0.33 V1, FCFS, sync scheduling): pass 1 walks
  ``running`` in admission order giving each request what it lacks (capped
  by ``long_prefill_token_threshold`` when more than one request is
  eligible, or always before vLLM 0.31 (``releases``), by the token budget and by max_model_len - computed - 1); when
  KV blocks run out it preempts the tail of ``running`` (recompute: blocks
  freed, computed reset, pushed to the front of ``waiting``) and stops the
  pass if it had to preempt the request itself. Pass 2 runs only when
  nothing was preempted: admit from the head of ``waiting`` while the
  budget lasts and ``len(running) < max_num_seqs``, each admission needing
  blocks for its whole current sequence; the first refusal stops the pass.
  Under ``--scheduling-policy priority`` (``cfg[C_SCHED_PRIORITY]``;
  ``docs/reference/priority-scheduling.md``) ``waiting`` is kept in
  (priority, arrival, request id) order, a preempted request goes back to
  its place in it, and the victim is the running request with the largest
  (priority, arrival), the first among equals: one already in this step's
  batch leaves it and gives its tokens back to the budget.
- ``sarathi``: decodes first (one token each, preempting the tail of
  ``running`` for blocks), then ongoing prefills, then new requests FCFS;
  whole-sequence blocks at admission with a 1% watermark.
- ``vllm-v0`` (chunked prefill off): if any waiting prompt can be admitted
  whole (token budget, ``max_num_seqs``, blocks + 1% watermark), the step
  is prefill-only; otherwise every running request decodes one token,
  preempting the tail for blocks.

``schedule_step`` mutates the state as vLLM does at schedule time
(computed tokens advance, blocks are allocated, queues move) and writes the
batch, its preemptions and its refusals to a ``StepPlan``;
``complete_step`` applies the step's outputs: a request whose computed
tokens reach its token count samples a token; it finishes (blocks and slot
freed) at its target length (vLLM's "stop", or max_tokens) or once
prompt + outputs reach ``max_model_len`` (vLLM's "length": ``check_stop``
in ``vllm/v1/core/sched/utils.py``, which the scheduler applies in
``update_from_output`` right after appending the token).
"""
from __future__ import annotations

from numba import literally, njit

from estimators.engine.completion import complete_step  # noqa: F401 (the step API: schedule, then complete)
from estimators.engine.kv_blocks import (
    ov_register_parts,
    register_overlay,
    settle,
)
from estimators.engine.layout import (
    C_ASYNC,
    C_BLOCK,
    C_BUDGET,
    C_CHUNKED,
    C_LONG_PREFILL,
    C_MAX_LEN,
    C_MAX_SEQS,
    C_POLICY,
    C_PREFIX,
    C_RULES,
    C_SCHED_PRIORITY,
    C_WATERMARK,
    F_BLOCKS,
    F_COMPUTED,
    F_NCACHED,
    F_OUTPUTS,
    F_PH,
    F_PROMPT,
    F_TARGET,
    PL_N,
    PL_NREJ,
    S_FREE_BLOCKS,
    S_NPREEMPT,
    S_NR,
    S_STEP,
    S_WN,
)
from estimators.engine.primitives import (
    admit_uncached,
    cdiv,
    wait_head,
)
from estimators.engine.releases import R_LONE_PREFILL_CAP
from estimators.engine.sched_moves import (
    _admit,
    _at_max_tokens_in_flight,
    _fills,
    _given_hit,
    _grow_fast,
    _grow_priority,
    _grow_slow,
    _hit,
    _needs_blocks,
    _place,
    _put,
    _register_slow,
    _reject_head,
)


@njit(cache=True)
def _schedule_v1(st, plan, asy):
    """vLLM V1; ``asy`` (a compile-time constant: the sync build carries no
    async branch) adds AsyncScheduler's rules."""
    literally(asy)
    cfg, req, sc, running, waiting = st.cfg, st.req, st.sc, st.running, st.waiting
    osc, rng, rslots = ov_register_parts(st)
    budget = cfg[C_BUDGET]
    b = cfg[C_BLOCK]
    max_len = cfg[C_MAX_LEN]
    # vLLM >= 0.31 lets a lone request use the whole budget; before, the threshold capped it too (C_RULES)
    cap = cfg[C_LONG_PREFILL] if sc[S_NR] + sc[S_WN] > 1 or cfg[C_RULES] & R_LONE_PREFILL_CAP else 0
    k = 0
    i = 0
    while i < sc[S_NR] and budget > 0:
        s = running[i]
        n = req[s, F_PROMPT] + req[s, F_OUTPUTS] - req[s, F_COMPUTED]
        if asy:
            if _at_max_tokens_in_flight(req[s, F_PH], req[s, F_COMPUTED], req[s, F_PROMPT], req[s, F_TARGET]):
                i += 1
                continue
            n += req[s, F_PH]
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
        if _needs_blocks(b, req[s, F_COMPUTED], n, req[s, F_BLOCKS]) and not _grow_fast(cfg, req, sc, osc, s, n):
            if cfg[C_SCHED_PRIORITY] != 0:  # the victim by priority; it may leave this step's batch
                ok, i, k, back = _grow_priority(st, plan, s, n, i, k)
                budget += back
                if not ok:
                    break
            elif not _grow_slow(st, plan, s, n):
                break
        k = _put(req, plan, k, s, n)
        if asy:
            _place(req, plan, k - 1, s)
        if cfg[C_PREFIX] != 0 and _fills(b, req[s, F_PROMPT], req[s, F_OUTPUTS], req[s, F_COMPUTED], req[s, F_NCACHED]) and \
                not register_overlay(cfg, req, osc, rng, rslots, s):
            _register_slow(st, s)
        budget -= n
        i += 1
    if sc[S_NPREEMPT] > 0:
        return k
    while budget > 0 and sc[S_WN] > 0:
        if sc[S_NR] >= cfg[C_MAX_SEQS]:
            break
        s = wait_head(sc, waiting)
        num_tokens = req[s, F_PROMPT] + req[s, F_OUTPUTS]
        if cfg[C_PREFIX] == 0:
            hb, ev = _given_hit(cfg, req, s, num_tokens)
        else:
            hb, ev = _hit(st, s, num_tokens)
        hit = hb * b
        n = num_tokens - hit
        if 0 < cap < n:
            n = cap
        if cfg[C_CHUNKED] == 0 and n > budget:
            break
        if n > budget:
            n = budget
        full = num_tokens if num_tokens < max_len else max_len
        watermark = cfg[C_WATERMARK] if sc[S_NR] > 0 else 0
        # the whole current sequence must fit (cached hit blocks need no new
        # block, but the evictable ones leave the free queue); no one behind
        # the head is tried
        need = cdiv(full, b) if ev < 0 else cdiv(full, b) - hb + ev
        if need + watermark > sc[S_FREE_BLOCKS]:
            if settle(st):
                continue  # deferred releases (SFS's overlay) freed blocks: look again (hits may have become free)
            break
        if cfg[C_PREFIX] == 0:
            s = admit_uncached(req, sc, running, waiting, cdiv(hit + n, b), hit)
        else:
            s = _admit(st, hb if ev >= 0 else 0, cdiv(hit + n, b), hit)
        k = _put(req, plan, k, s, n)
        if asy:
            _place(req, plan, k - 1, s)
        if cfg[C_PREFIX] != 0 and _fills(b, req[s, F_PROMPT], req[s, F_OUTPUTS], req[s, F_COMPUTED], req[s, F_NCACHED]) and \
                not register_overlay(cfg, req, osc, rng, rslots, s):
            _register_slow(st, s)
        budget -= n
    return k


@njit(cache=True)
def _schedule_sarathi(st, plan):
    cfg, req, sc, running, waiting = st.cfg, st.req, st.sc, st.running, st.waiting
    osc, rng, rslots = ov_register_parts(st)
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
        if _needs_blocks(b, req[s, F_COMPUTED], 1, req[s, F_BLOCKS]) and \
                not (_grow_fast(cfg, req, sc, osc, s, 1) or _grow_slow(st, plan, s, 1)):
            continue  # preempted itself; running shrank, i now points past the end
        k = _put(req, plan, k, s, 1)
        if cfg[C_PREFIX] != 0 and _fills(b, req[s, F_PROMPT], req[s, F_OUTPUTS], req[s, F_COMPUTED], req[s, F_NCACHED]) and \
                not register_overlay(cfg, req, osc, rng, rslots, s):
            _register_slow(st, s)
        budget -= 1
        i += 1
    # 2. ongoing prefills, in running order
    i = 0
    while i < sc[S_NR] and budget > 0:
        s = running[i]
        remaining = req[s, F_PROMPT] + req[s, F_OUTPUTS] - req[s, F_COMPUTED]
        if remaining > 0 and not (remaining == 1 and req[s, F_COMPUTED] >= req[s, F_PROMPT]):
            n = remaining if remaining < budget else budget
            if not _needs_blocks(b, req[s, F_COMPUTED], n, req[s, F_BLOCKS]) or \
                    _grow_fast(cfg, req, sc, osc, s, n) or _grow_slow(st, plan, s, n):
                k = _put(req, plan, k, s, n)
                if cfg[C_PREFIX] != 0 and _fills(b, req[s, F_PROMPT], req[s, F_OUTPUTS], req[s, F_COMPUTED], req[s, F_NCACHED]) and \
                        not register_overlay(cfg, req, osc, rng, rslots, s):
                    _register_slow(st, s)
                budget -= n
            else:
                continue
        i += 1
    # 3. new requests, FCFS; the whole sequence is allocated at admission
    while budget > 0 and sc[S_WN] > 0:
        if sc[S_NR] >= cfg[C_MAX_SEQS]:
            break
        s = wait_head(sc, waiting)
        num_tokens = req[s, F_PROMPT] + req[s, F_OUTPUTS]
        full = cdiv(num_tokens, b)
        if sc[S_FREE_BLOCKS] - full < cfg[C_WATERMARK]:
            if settle(st):
                continue  # deferred releases (SFS's overlay) freed blocks: look again
            break
        if cfg[C_PREFIX] == 0:
            hb, ev = _given_hit(cfg, req, s, num_tokens)
        else:
            hb, ev = _hit(st, s, num_tokens)
        hit = hb * b
        n = num_tokens - hit
        if n > budget:
            n = budget
        if cfg[C_PREFIX] == 0:
            s = admit_uncached(req, sc, running, waiting, full, hit)
        else:
            s = _admit(st, hb if ev >= 0 else 0, full, hit)
        k = _put(req, plan, k, s, n)
        if cfg[C_PREFIX] != 0 and _fills(b, req[s, F_PROMPT], req[s, F_OUTPUTS], req[s, F_COMPUTED], req[s, F_NCACHED]) and \
                not register_overlay(cfg, req, osc, rng, rslots, s):
            _register_slow(st, s)
        budget -= n
    return k


@njit(cache=True)
def _schedule_v0(st, plan):
    cfg, req, sc, running, waiting = st.cfg, st.req, st.sc, st.running, st.waiting
    osc, rng, rslots = ov_register_parts(st)
    budget = cfg[C_BUDGET]
    b = cfg[C_BLOCK]
    limit = cfg[C_MAX_LEN] if cfg[C_MAX_LEN] < budget else budget
    k = 0
    used = 0
    while sc[S_WN] > 0:
        s = wait_head(sc, waiting)
        num_tokens = req[s, F_PROMPT] + req[s, F_OUTPUTS]
        if num_tokens > limit:  # V0 ignores such prompts with an error
            _reject_head(st)
            plan.rejected[plan.counts[PL_NREJ]] = s
            plan.counts[PL_NREJ] += 1
            continue
        if used + num_tokens > budget or sc[S_NR] + 1 > cfg[C_MAX_SEQS]:
            break
        full = cdiv(num_tokens, b)
        if sc[S_FREE_BLOCKS] - full < cfg[C_WATERMARK]:
            if settle(st):
                continue  # deferred releases (SFS's overlay) freed blocks: look again
            break
        if cfg[C_PREFIX] == 0:
            hb, ev = _given_hit(cfg, req, s, num_tokens)
        else:
            hb, ev = _hit(st, s, num_tokens)
        hit = hb * b
        if cfg[C_PREFIX] == 0:
            s = admit_uncached(req, sc, running, waiting, full, hit)
        else:
            s = _admit(st, hb if ev >= 0 else 0, full, hit)
        k = _put(req, plan, k, s, num_tokens - hit)
        if cfg[C_PREFIX] != 0 and _fills(b, req[s, F_PROMPT], req[s, F_OUTPUTS], req[s, F_COMPUTED], req[s, F_NCACHED]) and \
                not register_overlay(cfg, req, osc, rng, rslots, s):
            _register_slow(st, s)
        used += num_tokens - hit
    if k > 0:
        return k  # prefill-only step
    i = 0
    while i < sc[S_NR]:
        s = running[i]
        if _needs_blocks(b, req[s, F_COMPUTED], 1, req[s, F_BLOCKS]) and \
                not (_grow_fast(cfg, req, sc, osc, s, 1) or _grow_slow(st, plan, s, 1)):
            continue
        k = _put(req, plan, k, s, 1)
        if cfg[C_PREFIX] != 0 and _fills(b, req[s, F_PROMPT], req[s, F_OUTPUTS], req[s, F_COMPUTED], req[s, F_NCACHED]) and \
                not register_overlay(cfg, req, osc, rng, rslots, s):
            _register_slow(st, s)
        i += 1
    return k


@njit(cache=True)
def schedule_step(st, plan):
    """Schedule one step into ``plan``; returns the number of requests in
    the batch (also ``plan.counts[PL_N]``). Preempted slots are
    ``plan.preempted[:st.sc[S_NPREEMPT]]``, refused ones (V0: prompts longer
    than the budget) ``plan.rejected[:plan.counts[PL_NREJ]]``."""
    st.sc[S_NPREEMPT] = 0
    st.sc[S_STEP] += 1
    plan.counts[PL_NREJ] = 0
    policy = st.cfg[C_POLICY]
    if policy == 0 and st.cfg[C_ASYNC] != 0:
        n = _schedule_v1(st, plan, True)
    elif policy == 0:
        n = _schedule_v1(st, plan, False)
    elif policy == 1:
        n = _schedule_sarathi(st, plan)
    else:
        n = _schedule_v0(st, plan)
    plan.counts[PL_N] = n
    return n


@njit(cache=True)
def drop_unservable_head(st):
    """Nothing runs and the head of ``waiting`` still cannot be admitted: it
    needs more KV than the instance has and would block the queue forever.
    Refuse it (status REJECTED) and return its slot; the caller frees it."""
    return _reject_head(st)
