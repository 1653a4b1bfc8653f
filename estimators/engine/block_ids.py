"""Block hash ids: which id each block of a request carries, for the block
pool (``block_pool``) and its overlay (``block_overlay``).

Block hash ids are non-negative int64 (``block_pool.NO_HASH`` = -1 marks a block
without one). A request's i-th full block has the id its trace gives
(``hash_ids[i]``), or past those (the partial prompt tail and outputs) an id
unique to the request, ``own_block_id(rid, i)``, so a resumed request hits its
own surviving blocks, outputs included, and nobody else does.

A trace's ``requests.hash_ids`` become ``RequestHashes`` above the engine
(``estimators.trace_blocks``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

OWN_BASE = 1 << 62  # ids at or above this are a request's own blocks
OWN_BLOCK_BITS = 21  # up to 2M blocks per request; request ids below 2**41
MAX_SHARED_ID = OWN_BASE - 1


@njit(cache=True, inline="always")
def own_block_id(rid, i):
    """The id of block ``i`` of request ``rid`` when its content is the
    request's own (past the trace's shared ids): never equal to a shared id
    (those are below OWN_BASE) nor to another request's."""
    return OWN_BASE + (rid << OWN_BLOCK_BITS) + i


@njit(cache=True, inline="always")
def block_hash_at(hflat, hoff, hn, rid, i):
    """Hash id of request ``rid``'s i-th full block: its trace id
    ``hflat[hoff + i]`` for the first ``hn`` blocks, else its own id."""
    if i < hn:
        return hflat[hoff + i]
    return own_block_id(rid, i)


# ----------------------------------------------------------------- per-trace block ids
class RequestHashes(NamedTuple):
    """Every request's full-block ids for one engine block size: request
    ``rid`` (its row in the trace) has ``flat[off[rid]:off[rid] + cnt[rid]]``;
    rows beyond ``cnt``'s length (or without ids) have none, so all their
    blocks are their own."""

    flat: np.ndarray
    off: np.ndarray
    cnt: np.ndarray


def no_request_hashes() -> RequestHashes:
    z = np.zeros(0, dtype=np.int64)
    return RequestHashes(z, z.copy(), z.copy())


@njit(cache=True, inline="always")
def ids_of(hashes, rid):
    """(offset, count) of request ``rid``'s trace ids."""
    if rid < hashes.cnt.size:
        return hashes.off[rid], hashes.cnt[rid]
    return 0, 0
