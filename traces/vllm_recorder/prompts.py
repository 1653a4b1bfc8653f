"""Token-id prompts with exact lengths and exact shared prefixes (stdlib only).

A trace gives each request a prompt length and, for prefix-sharing
workloads, ``hash_ids``: one id per ``block_tokens`` prompt tokens, prefix
chained (an id always stands on the same prefix). Sending prompts as token
ids (vLLM's completions API and ``LLMEngine.add_request`` both accept a list
of ints) makes the engine see exactly that structure: block ``k`` of a
prompt is a pure function of ``hash_ids[k]``, so equal ids give identical
token blocks and vLLM's prefix cache hits exactly where the trace says; every
token past the hashed blocks is drawn from a per-request stream, so it is
unique to the request (a chance 128-token collision has probability ~0).

Token ids avoid the specials 0-2 of ``shared/models``' word-level tokenizer
(``<unk>``, ``<s>``, ``</s>``), so the ids also map one to one onto words
(``w<id>``) for text-only endpoints.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache

FIRST_TOKEN_ID = 3  # 0-2 are <unk>, <s>, </s> in shared/models' tokenizer
DEFAULT_VOCAB = 8192


@lru_cache(maxsize=4096)
def _block(hash_id: int, block_tokens: int, vocab: int) -> tuple[int, ...]:
    rng = random.Random(f"block:{hash_id}")
    return tuple(rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(block_tokens))


def prompt_token_ids(prompt_tokens: int, hash_ids: Sequence[int] | None, block_tokens: int,
                     unique_key: str, vocab: int = DEFAULT_VOCAB) -> list[int]:
    """The prompt of one request: ``prompt_tokens`` ids, the first
    ``len(hash_ids) * block_tokens`` of them the blocks named by ``hash_ids``
    (truncated if the prompt is shorter), the rest unique to ``unique_key``
    (a stable per-request key, e.g. the request id and the seed)."""
    if prompt_tokens < 0:
        raise ValueError(f"negative prompt length {prompt_tokens}")
    ids: list[int] = []
    for h in hash_ids or ():
        if len(ids) >= prompt_tokens:
            break
        ids.extend(_block(int(h), block_tokens, vocab))
    del ids[prompt_tokens:]
    rng = random.Random(f"tail:{unique_key}")
    ids.extend(rng.randrange(FIRST_TOKEN_ID, vocab) for _ in range(prompt_tokens - len(ids)))
    return ids


def as_words(token_ids: Sequence[int]) -> str:
    """The text of ``token_ids`` under the word-level tokenizer (``w12 w55``)."""
    return " ".join(f"w{t}" for t in token_ids)
