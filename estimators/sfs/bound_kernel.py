"""Work an SFS estimate must simulate, counted over plain arrays (Numba):
the lower bound of ``estimators.sfs.bound`` reads an instance's queue in one
compiled pass instead of a dozen NumPy calls."""
from __future__ import annotations

from numba import njit

from estimators.engine import layout as L
from estimators.engine.timing import batch_typical_time


@njit(cache=True)
def _ahead_tokens(req, s, cfg):
    """Tokens waiting request ``s`` computes before it can start decoding
    (minus a hit given with it), or 0 where it may be refused or dropped
    (longer than the model, the budget without chunking, or the KV)."""
    total = req[s, L.F_PROMPT] + req[s, L.F_OUTPUTS]
    b = cfg[L.C_BLOCK]
    if total + 1 >= cfg[L.C_MAX_LEN] or total > cfg[L.C_BUDGET] or (total + 1 + b - 1) // b + 2 + cfg[L.C_WATERMARK] \
            >= cfg[L.C_NUM_BLOCKS]:
        return 0
    hit = req[s, L.F_HIT] if req[s, L.F_HIT] > 0 else 0
    w = total - req[s, L.F_COMPUTED] - hit
    return w if w > 0 else 0


@njit(cache=True)
def queue_work(req, sc, cfg, running, waiting, inbox, n_inbox, pred_total, decodes_first):
    """(W, att, D, sdc): prompt tokens of the requests waiting ahead of a new
    query (0 with a long-prefill threshold, which lets the query's chunks
    pass theirs); and, when ``decodes_first`` (the policy schedules running
    requests before waiting ones), the decodes certain to be in the first
    simulated step with their computed tokens -- only when that step's
    budget and free KV blocks are certain to hold every running request,
    counting those predicted to run at least two more steps. ``att``: the
    attention term sum of t (c + (t + 1) / 2) over a fresh request's
    prefill chunks, whatever the chunking r (r + 1) / 2 and more, summed
    over the fresh requests ahead (a recompute's last chunk may count as a
    decode, so preempted requests add none)."""
    w = 0
    att = 0.0
    if cfg[L.C_LONG_PREFILL] == 0:
        cap = sc[L.S_CAP]
        for k in range(sc[L.S_WN] + n_inbox):
            s = waiting[(sc[L.S_WHEAD] + k) % cap] if k < sc[L.S_WN] else inbox[k - sc[L.S_WN]]
            r = _ahead_tokens(req, s, cfg)
            w += r
            if req[s, L.F_OUTPUTS] == 0:
                att += r * (r + 1.0) / 2.0
    d = 0
    sdc = 0
    if not decodes_first:
        return w, att, d, sdc
    demand = 0
    blocks = 0
    b = cfg[L.C_BLOCK]
    for k in range(sc[L.S_NR]):
        s = running[k]
        rem = req[s, L.F_PROMPT] + req[s, L.F_OUTPUTS] - req[s, L.F_COMPUTED]
        if rem < 1:
            rem = 1
        demand += rem
        blocks += rem // b + 2
    if demand > cfg[L.C_BUDGET] or blocks > sc[L.S_FREE_BLOCKS]:
        return w, att, 0, 0
    for k in range(sc[L.S_NR]):
        s = running[k]
        c = req[s, L.F_COMPUTED]
        rid = req[s, L.F_RID]
        if c < req[s, L.F_PROMPT] or rid < 0 or rid >= pred_total.size:
            continue
        out = req[s, L.F_OUTPUTS]
        if pred_total[rid] - out >= 3 and req[s, L.F_PROMPT] + out + 3 < cfg[L.C_MAX_LEN]:
            d += 1
            sdc += c
    return w, att, d, sdc


@njit(cache=True)
def sfs_lower_bound(req, sc, cfg, running, waiting, inbox, n_inbox, pred_total, decodes_first, prompt, first_gap,
                    infl, infl_n, elapsed, form, coef, consts, fixed):
    """``estimators.sfs.bound``'s bound in one compiled call: ``infl`` the
    in-flight plan, ``fixed`` the overhead and intake the estimate adds,
    ``consts`` = (c0, per token, per decode, per decode's computed token,
    per prefill attention term, mult, gap, relative slack) (one array: each
    argument costs the call)."""
    c0, c_tok, c_dec, c_att, c_pa, mult, gap, slack = (consts[0], consts[1], consts[2], consts[3], consts[4],
                                                        consts[5], consts[6], consts[7])
    w, att, d, sdc = queue_work(req, sc, cfg, running, waiting, inbox, n_inbox, pred_total, decodes_first)
    w += prompt
    att += prompt * (prompt + 1.0) / 2.0
    rem = 0.0
    if infl_n > 0:  # the in-flight step's remainder, as the estimate charges it
        rem = batch_typical_time(form, coef, req, infl.slot, infl.tokens, infl.computed, infl_n) * mult - elapsed
        if rem < 0.0:
            rem = 0.0
    budget = cfg[L.C_BUDGET]
    steps = 1
    if budget > 0 and w > budget:
        steps = (w + budget - 1) // budget
    lb = rem + first_gap + (steps - 1) * gap + mult * (steps * c0 + c_tok * w + c_dec * d + c_att * sdc
                                                      + c_pa * att) + fixed
    lb = lb * (1.0 - slack) - 1e-12
    return lb if lb > 0.0 else 0.0
