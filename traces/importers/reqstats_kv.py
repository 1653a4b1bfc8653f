"""KV blocks held by a run's requests over time, from their per-request stamps.

vLLM's logger reports KV usage (``kv_cache_pct``) once a second but a run
without its resolved configuration does not say how many blocks that is a
share of. Between a request's first scheduling and its first token its
prompt is prefilled (chunk by chunk: taken as linear in time); from the
first token to the last its context grows by one token per output token
(linear between the two stamps). The blocks held at an instant are the
sum of ``ceil(tokens / block_size)``; their ratio to the reported usage is
the size of the cache (``reqstats_engine.kv_from_usage``).
"""
from __future__ import annotations

import numpy as np


def held_blocks(t: np.ndarray, scheduled: np.ndarray, first: np.ndarray, last: np.ndarray, prompt: np.ndarray,
                output: np.ndarray, block_size: int) -> np.ndarray:
    """Blocks held at each instant of ``t`` (all on one clock)."""
    out = np.zeros(len(t))
    for k, x in enumerate(t):
        pre = (scheduled <= x) & (x < first)
        dec = (first <= x) & (x < last)
        with np.errstate(invalid="ignore", divide="ignore"):
            frac_p = np.where(first > scheduled, (x - scheduled) / (first - scheduled), 1.0)
            frac_d = np.where(last > first, (x - first) / (last - first), 1.0)
        tokens = np.where(pre, prompt * frac_p, 0.0) + np.where(dec, prompt + 1 + (output - 1) * frac_d, 0.0)
        out[k] = float(np.ceil(tokens[tokens > 0] / block_size).sum())
    return out


def peak_blocks(scheduled: np.ndarray, first: np.ndarray, last: np.ndarray, prompt: np.ndarray,
                output: np.ndarray, block_size: int) -> int:
    """The most blocks held at once, sampled at every request's last token (where each context peaks)."""
    t = np.unique(np.concatenate([first, last - 1e-9]))
    return int(held_blocks(t, scheduled, first, last, prompt, output, block_size).max())
