"""A trace's prefix-block ids as the block pool takes them: ``requests.hash_ids``
(one id per ``hash_block_tokens`` prompt tokens, ``traces.prefix_blocks``)
mapped to one engine block size, as ``RequestHashes``.

Above the engine: the engine knows block ids, not traces.
"""
from __future__ import annotations

from estimators.engine.block_ids import RequestHashes, no_request_hashes
from traces.prefix_blocks import flat_block_ids


def request_hashes(hash_ids_col, prompt_tokens, hash_block_tokens: int | None, block_size: int) -> RequestHashes:
    """``RequestHashes`` of a trace's ``requests.hash_ids`` (see ``traces.prefix_blocks``)."""
    if hash_ids_col is None or not hash_block_tokens:
        return no_request_hashes()
    return RequestHashes(*flat_block_ids(hash_ids_col, prompt_tokens, hash_block_tokens, block_size))
