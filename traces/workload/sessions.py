"""Multi-turn chat sessions (``latroute trace generate --sessions``): the
workload where prefix caching pays.

A session arrives (Poisson, at ``rate / mean turns`` sessions per second so
that ``--rate`` stays the request rate), draws one of the paper's four tasks
from the mix and one of a few shared system prompts, and sends turns until it
stops (geometric number of turns, capped) or its context would pass
``max_prompt_tokens``:

- turn 1: system prompt + a user message with the task's prompt length;
- turn k > 1: turn k-1's prompt + its output + a follow-up message
  (lognormal, median ``followup_median`` tokens), so history grows.

Turns are open loop: turn k+1 arrives an exponential think time after turn
k's arrival (the generator does not know response times; the recordings d8-d10
were made the same way).

``hash_ids`` name the prompt's content per ``hash_block_tokens`` tokens,
prefix-chained: system prompts are whole blocks with fixed ids shared by every
session that uses them; a turn keeps the ids of the previous turn's full
blocks and takes fresh ids for the rest (its partial tail is completed by
different tokens). The previous turn's output appears in the next prompt as
new content: an engine would hit it only if its tokenisation round-trips,
which the trace does not assume.

SLOs, predicted lengths and accuracies follow DESIGN's rules per request, by
the session's task (``traces.workload.generator``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.policies.slo import slo_rule
from traces.policies.tasks import DEFAULT_MIX, OUTPUT_CLIP, TASKS
from traces.workload.generator import (
    ACC_HAT_SIGMA,
    ACCURACY_CONCENTRATION,
    PREDICTED_LENGTH_SCALE,
    Workload,
    _lognormal_tokens,
    predicted_lengths,
    quality_table,
)


@dataclass(frozen=True)
class SessionConfig:
    rate: float = 8.0  # requests per second (sessions arrive at rate / turns_mean)
    requests: int | None = None  # stop after this many requests (in arrival order)
    duration_s: float | None = None  # or: requests arriving before this time
    turns_mean: float = 4.0  # geometric number of turns per session
    max_turns: int = 20
    think_time_s: float = 10.0  # mean of the exponential gap between turns
    system_prompts: int = 4  # shared system prompts
    system_blocks: tuple[int, int] = (16, 64)  # system prompt length in hash blocks (uniform, inclusive)
    followup_median: float = 60.0  # tokens of a follow-up message (lognormal, sigma 0.8)
    max_prompt_tokens: int = 30000  # a session stops before its context passes this
    hash_block_tokens: int = 16  # vLLM's GPU block size
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    seed: int = 0
    predicted_length_scale: float = PREDICTED_LENGTH_SCALE
    accuracy_concentration: float = ACCURACY_CONCENTRATION
    acc_hat_sigma: float = ACC_HAT_SIGMA

    def check(self) -> None:
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("give a number of requests or a duration")
        if not self.rate > 0 or not self.turns_mean >= 1 or self.max_turns < 1 or not self.think_time_s >= 0:
            raise ValueError("rate must be > 0, turns mean >= 1, max turns >= 1, think time >= 0")
        lo, hi = self.system_blocks
        if self.system_prompts < 1 or not 0 <= lo <= hi or self.hash_block_tokens < 1:
            raise ValueError("need >= 1 system prompt, 0 <= min <= max system blocks, a positive hash block")
        if hi * self.hash_block_tokens >= self.max_prompt_tokens:
            raise ValueError("system prompts must be shorter than max_prompt_tokens")

    def params(self) -> dict[str, Any]:
        d = asdict(self)
        d["system_blocks"] = list(self.system_blocks)
        return d


def _sessions_needed(cfg: SessionConfig) -> tuple[int, float]:
    """How many sessions to draw, and the time horizon of their arrivals."""
    srate = cfg.rate / cfg.turns_mean
    if cfg.duration_s is not None:
        return int(srate * cfg.duration_s * 1.5 + 50), cfg.duration_s
    return int(cfg.requests / cfg.turns_mean * 1.5 + 50), np.inf


def generate_sessions(cfg: SessionConfig) -> Workload:
    cfg.check()
    r_sess, r_turn, r_len, r_slo, r_pred, r_acc, r_sys = (
        np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(7))
    hb = cfg.hash_block_tokens
    names = list(cfg.mix)
    specs = [TASKS[k] for k in names]
    p_task = np.array([cfg.mix[k] for k in names])

    sys_len = r_sys.integers(cfg.system_blocks[0], cfg.system_blocks[1] + 1, cfg.system_prompts) * hb
    next_id = 0
    sys_ids = []
    for L in sys_len:
        sys_ids.append(list(range(next_id, next_id + L // hb)))
        next_id += L // hb

    n_sess, horizon = _sessions_needed(cfg)
    while True:  # draw more sessions until the requested count or horizon is covered
        starts = np.cumsum(r_sess.exponential(cfg.turns_mean / cfg.rate, n_sess))
        rows = []
        for sid in range(n_sess):
            t = float(starts[sid])
            if t >= horizon:
                break
            task = int(r_turn.choice(len(names), p=p_task))
            spec = specs[task]
            s = int(r_turn.integers(0, cfg.system_prompts))
            turns = min(int(r_turn.geometric(1.0 / cfg.turns_mean)), cfg.max_turns)
            ids = list(sys_ids[s])
            ctx = int(sys_len[s])  # tokens of context so far (all previous prompts and outputs)
            for k in range(turns):
                msg = (_lognormal_tokens(r_len, np.array([spec.prompt_median]), np.array([spec.prompt_sigma]),
                                         (1, cfg.max_prompt_tokens))[0] if k == 0 else
                       _lognormal_tokens(r_len, np.array([cfg.followup_median]), np.array([0.8]),
                                         (1, cfg.max_prompt_tokens))[0])
                out = int(_lognormal_tokens(r_len, np.array([spec.output_median]), np.array([spec.output_sigma]),
                                            OUTPUT_CLIP)[0])
                prompt = ctx + int(msg)
                if prompt > cfg.max_prompt_tokens or t >= horizon:
                    break
                full = prompt // hb
                kept = len(ids)  # the previous prompt's full blocks (or the system prompt)
                ids = ids[:kept] + list(range(next_id, next_id + full - kept))
                next_id += full - kept
                rows.append((t, sid, k, task, prompt, out, list(ids)))
                ctx = prompt + out
                ids = ids[: (prompt // hb)]  # the partial tail is completed by other tokens next turn
                t += float(r_turn.exponential(cfg.think_time_s))
        rows.sort(key=lambda r: (r[0], r[1]))
        if cfg.requests is None or len(rows) >= cfg.requests or n_sess > 10 * cfg.requests + 1000:
            break
        n_sess *= 2
    if cfg.requests is not None:
        rows = rows[: cfg.requests]
    if not rows:
        raise ValueError("no session arrived within the duration")
    t, sid, turn, task, prompt, out, ids = (list(c) for c in zip(*rows))
    n = len(rows)
    prompt_a = np.array(prompt, dtype=np.int64)
    output_a = np.array(out, dtype=np.int64)
    task_idx = np.array(task, dtype=np.int64)
    request_id = np.arange(n, dtype=np.int64)
    requests = pd.DataFrame({
        "request_id": request_id,
        "arrival_s": np.array(t, dtype=np.float64),
        "prompt_tokens": prompt_a,
        "output_tokens": output_a,
        "task": np.array(names, dtype=object)[task_idx],
        "slo_ttft_s": slo_rule(prompt_a, r_slo),
        "predicted_output_tokens": predicted_lengths(output_a, cfg.predicted_length_scale, r_pred),
        "session": np.array(sid, dtype=np.int64),
        "turn": np.array(turn, dtype=np.int64),
        "hash_ids": ids,
    })
    quality = quality_table(request_id, task_idx, specs, cfg.accuracy_concentration, cfg.acc_hat_sigma, r_acc)
    return Workload(requests, quality)


def write_sessions(cfg: SessionConfig, out: str | Path, force: bool = False) -> dict[str, int]:
    from traces.store import TraceWriter

    wl = generate_sessions(cfg)
    with TraceWriter(out, force=force) as w:
        w.meta["source"] = {"kind": "generated", "generator": "latroute trace generate --sessions"}
        w.meta["generator"] = cfg.params()
        w.meta["hash_block_tokens"] = cfg.hash_block_tokens
        w.write_table("requests", wl.requests)
        w.write_table("quality", wl.quality)
    return w.rows
