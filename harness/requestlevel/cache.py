"""A warm prefix cache for a request-level replay, held in the engine's own cache.

Why: ``--prefix-cache warm`` says a run's prompts were already in vLLM's
prefix cache when it started (a benchmark re-sending the same prompts to a
server that ran them before). Handing each request its hit outright would
time the replay right, but the reconstructed engine would then hold no
cache, and estimators reading its snapshots (SFS looks hits up in the live
cache; the baselines with ``--cache-aware``) would compute every prompt
from scratch. So the cache is made the way the engine made it: each prompt
gets block ids of its own (``hash_ids``, one per engine block), and a
warm-up copy of every prompt (one output token) runs ``WARM_LEAD_S``
before the trace's first arrival, on every virtual engine (a trace's times
are never negative, so the replay's clock starts at the warm-up: ``shift_s``
is added to the trace's times). When the trace
starts, the warm-up is long finished and its blocks sit in the free queue
as cached blocks, as the previous run left them. The warm-up rows carry no
measured TTFT, so nothing scores them.

The warm set must fit: prompts that share a prefix the trace does not name
(LMBench's long inputs: ~21k tokens of shared context per request) would,
as separate prompts, hold more blocks than the engine has. When the
prompts' full blocks exceed ``FIT_SHARE`` of the KV blocks, each request is
handed its hit outright instead (``given_hits``): the replay's timing is the
same, but the engine holds no cache for estimators to read.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

FIT_SHARE = 0.5  # of the KV blocks: the rest is room for the running requests' own blocks
WARM_LEAD_S = 600.0  # the warm-up's arrival before the trace's first (an arrival-rate EWMA forgets it)
_ROW_SHIFT = 24  # block id = (row + 1) << 24 | block: unique per prompt, under 2**62 for 2**37 rows


@dataclass
class WarmInput:
    requests: pd.DataFrame  # warm-up rows first, then the trace's rows; both with hash_ids
    n_warm: int
    per_engine: int  # warm-up rows per virtual engine (warm-up row k goes to engine k // per_engine)
    shift_s: float  # added to the trace's times (the warm-up arrives at 0)


def prompt_block_ids(prompt_tokens: np.ndarray, block_size: int) -> list[list[int]]:
    """One id per full block of each prompt, unique to that prompt."""
    return [[((r + 1) << _ROW_SHIFT) | b for b in range(int(p) // block_size)]
            for r, p in enumerate(np.asarray(prompt_tokens, dtype=np.int64))]


def warm_input(reqs: pd.DataFrame, block_size: int, virtual_engines: int = 1) -> WarmInput:
    """``reqs`` (request_id, arrival_s, prompt_tokens, output_tokens; sorted by
    arrival) with hash ids, preceded by its warm-up."""
    out = reqs.copy()
    out["hash_ids"] = prompt_block_ids(out["prompt_tokens"].to_numpy(), block_size)
    n = len(out)
    warm = pd.concat([out] * virtual_engines, ignore_index=True)
    ids = out["request_id"]
    if pd.api.types.is_integer_dtype(ids):
        top = int(ids.max()) + 1 if n else 0
        warm["request_id"] = top + np.arange(len(warm), dtype=np.int64)  # past every trace id (ids are >= 0)
    else:
        warm["request_id"] = [f"warm-{k}" for k in range(len(warm))]
    first = float(out["arrival_s"].min()) if n else 0.0
    shift = WARM_LEAD_S - first
    out["arrival_s"] = out["arrival_s"] + shift
    warm["arrival_s"] = 0.0
    warm["output_tokens"] = 1
    return WarmInput(pd.concat([warm, out], ignore_index=True), len(warm), n, shift)


def warm_fits(prompt_tokens: np.ndarray, block_size: int, num_kv_blocks: int) -> bool:
    """Whether every prompt's full blocks fit in the cache together (see FIT_SHARE)."""
    blocks = int((np.asarray(prompt_tokens, dtype=np.int64) // block_size).sum())
    return blocks <= FIT_SHARE * num_kv_blocks


def given_hits(prompt_tokens: np.ndarray) -> np.ndarray:
    """Hits handed over with each request when the warm set does not fit:
    the whole prompt (the kernel keeps full blocks and recomputes at least
    the last token)."""
    return np.asarray(prompt_tokens, dtype=np.int64).copy()
