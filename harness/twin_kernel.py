"""The engine twin's inner loop, in Numba: run one instance's steps up to a
time, applying each step's outputs, taking in requests that arrived in the
meantime at the next schedule(), scheduling with the shared kernel and
drawing each step's true duration from the batch-time profile and its noise.

An instance is idle (0), running a step (1) or between steps (2): after a
step ends with work left, or when an arrival wakes an idle engine, the
engine spends the profile's inter-step gap (output handling, request intake)
and then runs schedule(); requests that arrive during the gap are part of
that schedule(), as in vLLM's engine loop.

Python calls ``advance`` for every instance before each arrival (so the
router sees every instance as it is at that moment) and ``kick`` when an
arrival finds an instance idle; everything between arrivals stays in Numba.
"""
from __future__ import annotations

from numba import njit

from estimators.batch_time_kernel import batch_typical_time, noisy_ratio
from estimators.sched_kernel import complete_step, drop_unservable_head, schedule_step, wait_push_back
from estimators.sched_state import (
    EV_FINISH,
    EV_FIRST,
    F_EVENT,
    F_PREEMPTIONS,
    F_PROMPT,
    F_RID,
    F_STATUS,
    S_NFREE_SLOTS,
    S_NR,
    S_WN,
    ST_WAITING,
)

# meta (int64) fields
M_BUSY, M_N, M_INBOX_N, M_FORM, M_STEPS, M_LOG_STEPS, M_LOG_ITEMS = 0, 1, 2, 3, 4, 5, 6
IDLE, RUNNING, GAP = 0, 1, 2
NM = 8
# params (float64) fields
P_GAP, P_MULT, P_NOISE_ON, P_LOG_ON = 0, 1, 2, 3
NP_ = 4
# times (float64): in-flight step start (or, between steps, the next schedule) and end (hidden from routers)
T_START, T_END = 0, 1


@njit(cache=True)
def _release(req, sc, free_slots, s):
    free_slots[sc[S_NFREE_SLOTS]] = s
    sc[S_NFREE_SLOTS] += 1


@njit(cache=True)
def _start_step(t, cfg, req, sc, running, waiting, free_slots, inbox, meta, out_slot, out_tok, out_cb, rejected,
                times, coef, noise, stall_q, stall_v, params, rng, reject_t):
    """schedule() at time ``t``: take in the inbox, schedule, draw the duration."""
    for i in range(meta[M_INBOX_N]):
        s = inbox[i]
        req[s, F_STATUS] = ST_WAITING
        wait_push_back(sc, waiting, s)
    meta[M_INBOX_N] = 0
    while True:
        rejected[0] = 0
        n = schedule_step(cfg, req, sc, running, waiting, out_slot, out_tok, out_cb, rejected)
        for r in range(rejected[0]):
            s = rejected[1 + r]
            reject_t[req[s, F_RID]] = t
            _release(req, sc, free_slots, s)
        if n > 0:
            break
        if sc[S_NR] == 0 and sc[S_WN] > 0:
            s = drop_unservable_head(req, sc, waiting)
            reject_t[req[s, F_RID]] = t
            _release(req, sc, free_slots, s)
            continue
        meta[M_BUSY] = IDLE
        meta[M_N] = 0
        return
    typical = batch_typical_time(meta[M_FORM], coef, req, out_slot, out_tok, out_cb, n)
    if params[P_NOISE_ON] > 0.0:
        dur = typical * noisy_ratio(noise, stall_q, stall_v, rng)
    else:
        dur = typical * params[P_MULT]
    times[T_START] = t
    times[T_END] = t + dur
    meta[M_BUSY] = RUNNING
    meta[M_N] = n
    meta[M_STEPS] += 1


@njit(cache=True)
def kick(t, meta, times, params):
    """An arrival woke an idle instance: it will schedule after the gap."""
    if meta[M_BUSY] == IDLE:
        meta[M_BUSY] = GAP
        times[T_START] = t + params[P_GAP]


@njit(cache=True)
def advance(t_until, cfg, req, sc, running, waiting, free_slots, inbox, meta, out_slot, out_tok, out_cb, rejected,
            times, coef, noise, stall_q, stall_v, params, rng, first_t, finish_t, reject_t, preempt_n,
            log_t, log_n, log_items):
    """Run every step that ends at or before ``t_until``. Returns 1 when the
    step log is full (the caller flushes it and calls again), else 0."""
    while True:
        if meta[M_BUSY] == RUNNING and times[T_END] <= t_until:
            n = meta[M_N]
            t_end = times[T_END]
            if params[P_LOG_ON] > 0.0:
                if meta[M_LOG_STEPS] >= log_n.size or meta[M_LOG_ITEMS] + n > log_items.shape[0]:
                    return 1
                k = meta[M_LOG_STEPS]
                log_t[k, 0] = times[T_START]
                log_t[k, 1] = t_end
                log_n[k] = n
                base = meta[M_LOG_ITEMS]
                for j in range(n):
                    s = out_slot[j]
                    log_items[base + j, 0] = req[s, F_RID]
                    log_items[base + j, 1] = out_tok[j]
                    log_items[base + j, 2] = out_cb[j]
                    log_items[base + j, 3] = req[s, F_PROMPT]
                meta[M_LOG_STEPS] = k + 1
                meta[M_LOG_ITEMS] = base + n
            complete_step(req, sc, running, free_slots, out_slot, n)
            for j in range(n):
                s = out_slot[j]
                ev = req[s, F_EVENT]
                if ev & EV_FIRST:
                    first_t[req[s, F_RID]] = t_end
                if ev & EV_FINISH:
                    finish_t[req[s, F_RID]] = t_end
                    preempt_n[req[s, F_RID]] = req[s, F_PREEMPTIONS]
            meta[M_N] = 0
            if sc[S_NR] + sc[S_WN] + meta[M_INBOX_N] > 0:
                meta[M_BUSY] = GAP
                times[T_START] = t_end + params[P_GAP]
            else:
                meta[M_BUSY] = IDLE
        elif meta[M_BUSY] == GAP and times[T_START] <= t_until:
            _start_step(times[T_START], cfg, req, sc, running, waiting, free_slots, inbox, meta, out_slot, out_tok,
                        out_cb, rejected, times, coef, noise, stall_q, stall_v, params, rng, reject_t)
        else:
            return 0
