"""Exact event skipping for the twin's kernel: what a run of identical
decode steps does to an instance's scheduler state, in Numba, so the twin
(``harness.twin.loop.kernel``) can advance such a run without calling the
scheduler kernel once per step.

A *steady* run is a stretch of steps whose batch is every running
request, in ``running`` order, one decode token each, nothing preempted,
admitted or refused. Between steps, with no arrival to take in, every
running request a decode one token behind and no more of them than the
token budget, the next schedule() under each policy of
``estimators.engine.kernel`` starts one when nobody waits; when requests
wait, when the step just done had this same batch one token each (its
schedule() then refused the head of ``waiting``, see below). The steps
after it make the same decisions until something they decide on changes:

- a request finishes (its target length, or max_model_len): the runs stop
  one step before the first finish, which the twin knows;
- KV blocks run out (a growth would preempt): a run only covers steps
  whose block growth, summed over the run, fits the free blocks now, so no
  gate inside it can fail; blocks are counts here (prefix caching off:
  no block ids, no free-queue order to keep), so allocating a run's
  blocks at once leaves the same state as allocating them step by step;
- a waiting request becomes admissible: the last step's schedule()
  refused the head of ``waiting`` (or never reached it) on conditions
  that are constant during the run (the token budget left after the
  decodes, ``len(running)``, the head's own length and cap) or on free
  blocks, which only fall during a run; so it is refused at every step of
  the run too;
- an arrival: the twin's ``advance`` receives none mid-call and stops a
  run at its ``t_until``.

The step time of a decode-only batch needs only the count of decodes and
the sums of their computed-before tokens c and of c^2
(``estimators.engine.timing.batch_typical_time``); each decode's c grows
by one per step, so the sums at step j are S1 + n j and S2 + 2 j S1 + n j^2.
They are integers: as long as they stay below 2^53 the float sums the
scheduled batch is charged with are these integers exactly, whatever the
order of addition, and ``timing.features_time`` then computes the same
float. Larger sums are never skipped.

What is not covered falls back to the scheduler kernel step by step:
prefix caching on (block ids and a free queue), any batch with a prefill
chunk, a preemption or a refusal, an arrival waiting to be taken in.
"""
from __future__ import annotations

from numba import njit

from estimators.engine.layout import (
    C_BLOCK,
    C_BUDGET,
    C_MAX_LEN,
    C_PREFIX,
    F_BLOCKS,
    F_COMPUTED,
    F_EVENT,
    F_OUTPUTS,
    F_PROMPT,
    F_STATUS,
    F_TARGET,
    PREFIX_OFF,
    S_FREE_BLOCKS,
    S_NPREEMPT,
    S_NR,
    S_WN,
    ST_RUNNING,
)
from estimators.engine.primitives import cdiv

EXACT = 2.0 ** 53  # floats hold every integer below this exactly
MAX_RUN = 1 << 40  # "no finish in sight": a bound no run reaches


@njit(cache=True)
def steady_run(st, plan, n_last):
    """Between steps, no arrival waiting to be taken in: how many steps the
    next schedule() starts of a steady run (every running request one
    decode token, the same batch each step, no finish and no KV gate), and
    the sums of the decodes' computed tokens S1 and of their squares S2
    before the first of them. With requests waiting, only after a step of
    the same batch one token each (``plan``, ``n_last`` requests, nothing
    refused; -1 if it refused any), whose schedule() refused the head of
    ``waiting`` on what the run keeps constant or lowers; with nobody
    waiting, after any step. (0, 0, 0) if not steady, or caching is on, or
    the sums could outgrow exact floats."""
    req, sc, cfg, running = st.req, st.sc, st.cfg, st.running
    n = sc[S_NR]
    if n <= 0 or n > cfg[C_BUDGET] or cfg[C_PREFIX] != PREFIX_OFF:
        return 0, 0, 0
    after = sc[S_WN] > 0  # the waiting head's refusal is known only from a step of this same batch
    if after and (n_last != n or sc[S_NPREEMPT] != 0):
        return 0, 0, 0
    max_len = cfg[C_MAX_LEN]
    k = MAX_RUN
    s1 = 0
    s2 = 0
    cmax = 0
    for j in range(n):
        s = running[j]
        if req[s, F_STATUS] != ST_RUNNING:
            return 0, 0, 0
        p, o, c = req[s, F_PROMPT], req[s, F_OUTPUTS], req[s, F_COMPUTED]
        if o < 1 or c != p + o - 1:
            return 0, 0, 0  # not a decode one token behind
        if after and (plan.slot[j] != s or plan.tokens[j] != 1 or plan.computed[j] != c - 1):
            return 0, 0, 0
        rem = req[s, F_TARGET] - o  # outputs to its target; the step sampling the last one finishes it
        if max_len - p - o < rem:
            rem = max_len - p - o  # vLLM's "length" comes first
        if rem - 1 < k:
            k = rem - 1
            if k <= 0:
                return 0, 0, 0
        s1 += c
        s2 += c * c
        if c > cmax:
            cmax = c
    top = float(cmax + k)
    if top * top * n >= EXACT or float(s1) + float(k) * n >= EXACT:
        return 0, 0, 0
    return _kv_bound(st, n, k), s1, s2


@njit(cache=True)
def _blocks_for(st, n, m):
    """Blocks the run's decodes must grow by to schedule ``m`` more steps."""
    req, b = st.req, st.cfg[C_BLOCK]
    need = 0
    for j in range(n):
        s = st.running[j]
        g = cdiv(req[s, F_COMPUTED] + m, b) - req[s, F_BLOCKS]
        if g > 0:
            need += g
    return need


@njit(cache=True)
def _kv_bound(st, n, k):
    """The most steps, at most ``k``, whose block growth fits the free
    blocks (growth only rises with the steps: bisect)."""
    free = st.sc[S_FREE_BLOCKS]
    if _blocks_for(st, n, k) <= free:
        return k
    lo, hi = 0, k  # fits(lo), not fits(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _blocks_for(st, n, mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


@njit(cache=True)
def take_batch(st, plan, n):
    """The run's batch into ``plan``: ``running``'s first ``n``, one token
    each (what schedule_step writes for it; nothing preempted)."""
    for j in range(n):
        plan.slot[j] = st.running[j]
        plan.tokens[j] = 1
    st.sc[S_NPREEMPT] = 0


@njit(cache=True)
def apply_run(st, plan, n, scheduled, completed):
    """The state after ``scheduled`` more steps of the steady batch of ``n``
    in ``plan``, the first ``completed`` of them completed (the last one in
    flight otherwise): computed tokens, outputs, blocks and the free count
    as the kernel leaves them, the plan holding the last scheduled step's
    computed-before tokens, no step events (nothing finished or began);
    the caller counts the steps (``S_STEP``)."""
    req, sc, b = st.req, st.sc, st.cfg[C_BLOCK]
    free = sc[S_FREE_BLOCKS]
    for j in range(n):
        s = plan.slot[j]
        c = req[s, F_COMPUTED] + scheduled
        plan.computed[j] = c - 1
        req[s, F_COMPUTED] = c
        req[s, F_OUTPUTS] += completed
        nb = cdiv(c, b)
        if nb > req[s, F_BLOCKS]:
            free -= nb - req[s, F_BLOCKS]
            req[s, F_BLOCKS] = nb
        if completed > 0:
            req[s, F_EVENT] = 0
    sc[S_FREE_BLOCKS] = free
