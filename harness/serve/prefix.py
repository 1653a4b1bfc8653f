"""Prefix caching in ``serve``: block hash ids from a request's own prompt
token ids, and the growing ``RequestHashes`` the kernel reads them from.

vLLM hashes each *full* block of ``block_size`` prompt tokens, chained
(the hash of block i covers its parent's hash and its own tokens, plus a
``cache_salt`` in the first block), so two prompts share block i's hash
exactly when they share their first (i+1)·block_size tokens. This module
does the same with a 64-bit BLAKE2b digest cut to the ids the block pool
takes (0..2^62-1, ``estimators.engine.block_ids.MAX_SHARED_ID``): not
vLLM's sha256 bytes, but equal prefix, equal id, and the same ids on every
run and every instance. Hashes are taken per ``hash_block_tokens`` tokens
for the whole pool (the gcd of its caching instances' block sizes, so one
id list serves all) and mapped to each instance's block size as the
offline twin maps a trace's ``hash_ids`` (``traces.datamodel.prefix_blocks``): a
recording's ``hash_ids`` replay the served hits exactly.
"""
from __future__ import annotations

import hashlib
import math
from array import array

import numpy as np

from estimators.engine.block_ids import MAX_SHARED_ID, RequestHashes
from traces.datamodel.prefix_blocks import engine_block_ids

_ROOT = hashlib.blake2b(b"latroute-serve-prefix", digest_size=8).digest()  # vLLM's NONE_HASH, in spirit


def pool_hash_block(block_sizes: list[int]) -> int | None:
    """Tokens per hash id for a pool whose caching instances have these
    block sizes (None: no instance caches, no ids)."""
    return math.gcd(*block_sizes) if block_sizes else None


def block_hashes(tokens: list[int], block: int, salt: str | None = None) -> list[int]:
    """Chained ids of every full ``block``-token block of ``tokens``."""
    n = len(tokens) // block
    raw = memoryview(array("i", tokens[:n * block]).tobytes())
    step = 4 * block
    out = [0] * n
    parent = _ROOT
    blake = hashlib.blake2b
    for i in range(n):
        h = blake(parent, digest_size=8)
        h.update(raw[i * step:(i + 1) * step])
        if i == 0 and salt:
            h.update(b"\0salt\0" + salt.encode())
        parent = h.digest()
        out[i] = int.from_bytes(parent, "little") & MAX_SHARED_ID
    return out


class GrowingHashes:
    """One instance's ``RequestHashes``, extended as requests arrive (request
    ``rid`` is the instance's rid-th request). Arrays are written in place
    and only re-made, doubled, when full: ``grew`` says the state must be
    handed the new ones (``SchedState.with_hashes``)."""

    def __init__(self, requests: int = 256, ids: int = 1 << 14):
        self.flat = np.zeros(ids, dtype=np.int64)
        self.off = np.zeros(requests, dtype=np.int64)
        self.cnt = np.zeros(requests, dtype=np.int64)
        self.used = 0

    def value(self) -> RequestHashes:
        return RequestHashes(self.flat, self.off, self.cnt)

    def add(self, rid: int, hash_ids: list[int] | None, hash_block: int, prompt: int, block_size: int) -> bool:
        """Request ``rid``'s engine block ids; True when the arrays were re-made."""
        ids = (engine_block_ids(hash_ids, hash_block, prompt, block_size) if hash_ids
               else np.zeros(0, dtype=np.int64))
        grew = False
        if rid >= self.off.size:
            n = max(2 * self.off.size, rid + 1)
            self.off = np.concatenate([self.off, np.zeros(n - self.off.size, dtype=np.int64)])
            self.cnt = np.concatenate([self.cnt, np.zeros(n - self.cnt.size, dtype=np.int64)])
            grew = True
        if self.used + ids.size > self.flat.size:
            n = max(2 * self.flat.size, self.used + ids.size)
            self.flat = np.concatenate([self.flat, np.zeros(n - self.flat.size, dtype=np.int64)])
            grew = True
        self.flat[self.used:self.used + ids.size] = ids
        self.off[rid], self.cnt[rid] = self.used, ids.size
        self.used += ids.size
        return grew
