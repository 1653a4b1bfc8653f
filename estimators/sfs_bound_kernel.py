"""Work an SFS estimate must simulate, counted over plain arrays (Numba):
the lower bound of ``estimators.sfs_bound`` reads an instance's queue in one
compiled pass instead of a dozen NumPy calls."""
from __future__ import annotations

from numba import njit

from estimators.engine.layout import (
    C_BLOCK,
    C_BUDGET,
    C_LONG_PREFILL,
    C_MAX_LEN,
    C_NUM_BLOCKS,
    C_WATERMARK,
    F_COMPUTED,
    F_HIT,
    F_OUTPUTS,
    F_PROMPT,
    F_RID,
    S_CAP,
    S_FREE_BLOCKS,
    S_NR,
    S_WHEAD,
    S_WN,
)


@njit(cache=True)
def _ahead_tokens(req, s, cfg):
    """Tokens waiting request ``s`` computes before it can start decoding
    (minus a hit given with it), or 0 where it may be refused or dropped
    (longer than the model, the budget without chunking, or the KV)."""
    total = req[s, F_PROMPT] + req[s, F_OUTPUTS]
    b = cfg[C_BLOCK]
    if total + 1 >= cfg[C_MAX_LEN] or total > cfg[C_BUDGET] or (total + 1 + b - 1) // b + 2 + cfg[C_WATERMARK] \
            >= cfg[C_NUM_BLOCKS]:
        return 0
    hit = req[s, F_HIT] if req[s, F_HIT] > 0 else 0
    w = total - req[s, F_COMPUTED] - hit
    return w if w > 0 else 0


@njit(cache=True)
def queue_work(req, sc, cfg, running, waiting, inbox, n_inbox, pred_total, decodes_first):
    """(W, D, sdc): prompt tokens of the requests waiting ahead of a new
    query (0 with a long-prefill threshold, which lets the query's chunks
    pass theirs); and, when ``decodes_first`` (the policy schedules running
    requests before waiting ones), the decodes certain to be in the first
    simulated step with their computed tokens -- only when that step's
    budget and free KV blocks are certain to hold every running request,
    counting those predicted to run at least two more steps."""
    w = 0
    if cfg[C_LONG_PREFILL] == 0:
        cap = sc[S_CAP]
        for k in range(sc[S_WN]):
            w += _ahead_tokens(req, waiting[(sc[S_WHEAD] + k) % cap], cfg)
        for k in range(n_inbox):
            w += _ahead_tokens(req, inbox[k], cfg)
    d = 0
    sdc = 0
    if not decodes_first:
        return w, d, sdc
    demand = 0
    blocks = 0
    b = cfg[C_BLOCK]
    for k in range(sc[S_NR]):
        s = running[k]
        rem = req[s, F_PROMPT] + req[s, F_OUTPUTS] - req[s, F_COMPUTED]
        if rem < 1:
            rem = 1
        demand += rem
        blocks += rem // b + 2
    if demand > cfg[C_BUDGET] or blocks > sc[S_FREE_BLOCKS]:
        return w, 0, 0
    for k in range(sc[S_NR]):
        s = running[k]
        c = req[s, F_COMPUTED]
        rid = req[s, F_RID]
        if c < req[s, F_PROMPT] or rid < 0 or rid >= pred_total.size:
            continue
        out = req[s, F_OUTPUTS]
        if pred_total[rid] - out >= 3 and req[s, F_PROMPT] + out + 3 < cfg[C_MAX_LEN]:
            d += 1
            sdc += c
    return w, d, sdc
