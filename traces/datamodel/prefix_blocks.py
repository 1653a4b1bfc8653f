"""Prefix-block hash ids: from a trace's ``hash_ids`` (one id per
``hash_block_tokens`` prompt tokens, meta.json) to the ids of an engine's
full KV blocks.

A trace id stands for its whole prefix (vLLM's hashes are chained, and so
are Mooncake's ids and the recordings'), so two requests share engine block
i exactly when they share the id covering it:

- hash block = engine block: the ids as they are;
- hash block = m x engine block (Mooncake's 512 against 128 or 16): hash id h
  covers m engine blocks with ids ``h * m + k`` (k = 0..m-1), a bijection, so
  derived ids never collide with each other;
- engine block = m x hash block: engine block i takes the id of the last hash
  block it covers (the prefix up to its end).

Only full engine blocks of the prompt get an id (vLLM hashes full blocks
only): a partial last hash block yields its full engine blocks and no more.
Blocks past those (the prompt's partial tail, outputs) are the request's own;
the kernel gives them ids at or above ``estimators.engine.block_ids.OWN_BASE``, which
no trace id reaches (trace ids are checked to lie below ``MAX_TRACE_ID``).
"""
from __future__ import annotations

import numpy as np

MAX_TRACE_ID = (1 << 62) - 1  # = estimators.engine.block_ids.OWN_BASE - 1 (the data layer imports no engine; tests/test_layers.py checks they agree)


def parse_id_list(text: str) -> list[int] | None:
    """Space-separated ids (recordings' ``hash_ids``); '' -> [], NaN -> None.
    Raises ValueError with a reason."""
    if text is None or (isinstance(text, float) and np.isnan(text)):
        return None
    ids = [int(t) for t in str(text).split()]
    for h in ids:
        if not 0 <= h <= MAX_TRACE_ID:
            raise ValueError(f"hash id {h} outside [0, 2**62)")
    return ids


def engine_block_ids(hash_ids, hash_block_tokens: int, prompt_tokens: int, block_size: int) -> np.ndarray:
    """Ids of the prompt's full engine blocks (see module doc)."""
    n_full = int(prompt_tokens) // block_size
    ids = np.asarray(hash_ids if hash_ids is not None else [], dtype=np.int64)
    if ids.size == 0 or n_full == 0:
        return np.zeros(0, dtype=np.int64)
    if hash_block_tokens == block_size:
        out = ids
    elif hash_block_tokens % block_size == 0:
        m = hash_block_tokens // block_size
        if int(ids.max()) > MAX_TRACE_ID // m:
            raise ValueError(f"hash id {int(ids.max())} too large to split into {m} engine blocks")
        out = (ids[:, None] * m + np.arange(m, dtype=np.int64)[None, :]).ravel()
    elif block_size % hash_block_tokens == 0:
        m = block_size // hash_block_tokens
        out = ids[m - 1::m]
    else:
        raise ValueError(f"hash block of {hash_block_tokens} tokens and engine block of {block_size} "
                         "tokens: one must divide the other")
    return np.ascontiguousarray(out[:n_full])


def flat_block_ids(hash_ids_col, prompt_tokens, hash_block_tokens: int | None,
                   block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every request's engine block ids concatenated: (flat ids, offset, count)
    per request, for the kernel. Requests without ids (or a trace without
    ``hash_block_tokens``) get none: all their blocks are their own."""
    n = len(prompt_tokens)
    offs = np.zeros(n, dtype=np.int64)
    counts = np.zeros(n, dtype=np.int64)
    parts = []
    pos = 0
    for i in range(n):
        h = hash_ids_col[i] if hash_ids_col is not None and hash_block_tokens else None
        ids = (engine_block_ids(h, hash_block_tokens, int(prompt_tokens[i]), block_size)
               if h is not None else np.zeros(0, dtype=np.int64))
        offs[i], counts[i] = pos, ids.size
        pos += ids.size
        parts.append(ids)
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return flat.astype(np.int64), offs, counts


def ideal_hit_tokens(hash_ids_col, prompt_tokens, hash_block_tokens: int) -> tuple[int, int]:
    """(prompt tokens in hash blocks seen before in the trace, all prompt
    tokens): the hit share of an infinite cache, in arrival order, at the
    trace's own hash-block granularity (only whole hash blocks count)."""
    seen: set[int] = set()
    hit = 0
    total = 0
    for h, p in zip(hash_ids_col, prompt_tokens):
        total += int(p)
        if h is None:
            continue
        full = min(len(h), int(p) // hash_block_tokens)
        k = 0
        while k < full and int(h[k]) in seen:
            k += 1
        hit += k * hash_block_tokens
        seen.update(int(x) for x in h[:full])
    return hit, total
