"""The second half of a scheduler step: applying its outputs.

``complete_step`` is the step API's other call (``estimators.engine.kernel``
plans with ``schedule_step``; the twin, SFS and the peer suite call both,
re-exported there): a request whose computed tokens reach its token count
samples a token, and finishes at its target length or max_model_len. Apart
from the planner because vLLM's two modes apply outputs differently
(``update_from_output`` after the step just run, or under async scheduling
one step late, with placeholders and stale outputs), and both stay beside
each other here.
"""
from __future__ import annotations

from numba import njit

from estimators.engine.kv_blocks import (
    ov_lists,
    release_live_holder,
)
from estimators.engine.layout import (
    C_ASYNC,
    C_BLOCK,
    C_MAX_LEN,
    C_PREFIX,
    EV_FINISH,
    EV_FIRST,
    EV_LENGTH,
    F_COMPUTED,
    F_EVENT,
    F_NCACHED,
    F_OUTPUTS,
    F_PH,
    F_PREEMPTIONS,
    F_PROMPT,
    F_RID,
    F_STATUS,
    F_TARGET,
    PREFIX_OFF,
    ST_RUNNING,
    ST_WAITING,
)
from estimators.engine.primitives import (
    compact_running,
    finish,
    finish_uncached,
    finished_slot,
    wait_remove,
)
from estimators.engine.sched_moves import (
    _register_slow,
)

# vLLM's max_concurrent_batches under async scheduling without pipeline parallelism: the batches in
# flight at once (a step is planned while the one before it runs; its outputs are applied one step late)
BATCH_QUEUE = 2

@njit(cache=True, inline="always")
def _token_events(outputs, target, prompt, max_len):
    """The events of a request that has just appended its ``outputs``-th
    token: the first token; the finish at its target length, or (vLLM's
    "length") once prompt + outputs reach max_model_len (``check_stop``).
    ``_complete_sync`` spells the same checks out inline: through this
    helper the sync path measured ~5% slower in ``bench --only sfs``."""
    ev = EV_FIRST if outputs == 1 else 0
    if outputs >= target:
        ev |= EV_FINISH
    elif prompt + outputs >= max_len:
        ev |= EV_FINISH | EV_LENGTH
    return ev


@njit(cache=True)
def _complete_async(st, plan, n):
    """``complete_step`` under async scheduling (``AsyncScheduler``'s
    ``update_from_output``), for a step whose outputs arrive after the next
    step was planned: an item whose request finished meanwhile (or whose
    slot now holds another request) is skipped; a sampled token is appended
    and, unless the output is stale (scheduled before the request's last
    preemption), takes a placeholder back; the stop checks are sync mode's,
    and a stale token can finish a preempted request in ``waiting``. On
    every output of a running request, the finishing one included, its
    full blocks are registered up to its computed tokens minus the
    placeholders still in flight, before a finish frees them (so they join
    the free queue's tail as cached blocks). Prefix caching with SFS's
    overlay is not modelled here."""
    req, sc, cfg = st.req, st.sc, st.cfg
    max_len = cfg[C_MAX_LEN]
    b = cfg[C_BLOCK]
    finished = 0
    for j in range(n):
        s = plan.slot[j]
        status = req[s, F_STATUS]
        if req[s, F_RID] != plan.rid[j]:
            continue  # the slot holds another request now: its events are its own
        req[s, F_EVENT] = 0
        if status != ST_RUNNING and status != ST_WAITING:
            continue  # finished meanwhile: the output is dropped, no event
        stale = req[s, F_PREEMPTIONS] != plan.preemptions[j]  # preempted since: vLLM's num_stale_output_tokens
        if plan.samples[j] == 0:
            continue
        req[s, F_OUTPUTS] += 1
        if not stale:
            req[s, F_PH] -= 1
        req[s, F_EVENT] |= _token_events(req[s, F_OUTPUTS], req[s, F_TARGET], req[s, F_PROMPT], max_len)
        if status == ST_RUNNING and cfg[C_PREFIX] != PREFIX_OFF:
            # every output of a running request, the finishing one included, registers its full blocks
            # before any free: a finished request's blocks then carry hashes and join the free queue's
            # tail, not its head (AsyncScheduler._update_request_with_output, then _free_request)
            done = req[s, F_COMPUTED] - req[s, F_PH]
            if done // b > req[s, F_NCACHED]:
                computed = req[s, F_COMPUTED]
                req[s, F_COMPUTED] = done  # register up to the tokens whose outputs are known
                _register_slow(st, s)
                req[s, F_COMPUTED] = computed
        if req[s, F_EVENT] & EV_FINISH:
            if status == ST_WAITING:  # preempted, finished by its stale token: it holds no blocks
                wait_remove(sc, st.waiting, s)
                finished_slot(req, sc, st.free_slots, s)
            elif cfg[C_PREFIX] == PREFIX_OFF:
                finish_uncached(req, sc, st.free_slots, s)
            else:
                finish(st, s)
            finished += 1
    if finished > 0:
        compact_running(req, st.sc, st.running)
    return finished


@njit(cache=True)
def complete_step(st, plan, n):
    """Apply the outputs of a step that scheduled ``plan.slot[:n]``.

    Sets ``req[s, F_EVENT]`` (EV_FIRST, EV_FINISH, EV_LENGTH) for every
    scheduled slot; finished requests leave ``running`` and their slots are
    recycled (their rows stay readable until the slot is reused). A request
    finishes at its target output length, or (EV_LENGTH) as soon as its
    prompt + outputs reach max_model_len, as vLLM's ``check_stop`` does.
    Async scheduling: ``_complete_async``."""
    if st.cfg[C_ASYNC] != 0:
        return _complete_async(st, plan, n)
    return _complete_sync(st, plan, n)


@njit(cache=True)
def _complete_sync(st, plan, n):
    """``complete_step`` in sync mode: the outputs of the step just run."""
    req, sc, cfg = st.req, st.sc, st.cfg
    osc, pend = ov_lists(st)
    max_len = cfg[C_MAX_LEN]
    finished = 0
    for j in range(n):
        s = plan.slot[j]
        req[s, F_EVENT] = 0
        if req[s, F_COMPUTED] >= req[s, F_PROMPT] + req[s, F_OUTPUTS]:
            req[s, F_OUTPUTS] += 1
            if req[s, F_OUTPUTS] == 1:
                req[s, F_EVENT] |= EV_FIRST
            if req[s, F_OUTPUTS] >= req[s, F_TARGET]:
                req[s, F_EVENT] |= EV_FINISH
            elif req[s, F_PROMPT] + req[s, F_OUTPUTS] >= max_len:
                req[s, F_EVENT] |= EV_FINISH | EV_LENGTH
            if req[s, F_EVENT] & EV_FINISH:
                if cfg[C_PREFIX] == PREFIX_OFF:
                    finish_uncached(req, sc, st.free_slots, s)
                elif release_live_holder(cfg, req, sc, osc, pend, s):  # SFS: a resident holding live blocks
                    finished_slot(req, sc, st.free_slots, s)
                else:
                    finish(st, s)
                finished += 1
    if finished > 0:
        compact_running(req, st.sc, st.running)
    return finished
