"""A trace's prefix-block ids as the block pool takes them: ``requests.hash_ids``
(one id per ``hash_block_tokens`` prompt tokens, ``traces.datamodel.prefix_blocks``)
mapped to one engine block size, as ``RequestHashes``; and the one way a
kernel's refusal of a trace (``KernelInputError``) becomes a ``BadInput``
naming the trace's file.

Above the engine: the engine knows block ids, not traces.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from estimators.engine.block_ids import MAX_SHARED_ID, RequestHashes, no_request_hashes
from estimators.engine.layout import KernelInputError
from traces.datamodel.prefix_blocks import flat_block_ids
from traces.errors import BadInput


def request_hashes(hash_ids_col, prompt_tokens, hash_block_tokens: int | None, block_size: int) -> RequestHashes:
    """``RequestHashes`` of a trace's ``requests.hash_ids`` (see ``traces.datamodel.prefix_blocks``).

    Ids outside 0..``MAX_SHARED_ID`` are refused (``KernelInputError``
    naming the row): -1 is the block pool's empty mark and ids from 2^62 up
    are requests' own blocks, so either would corrupt the pool's hash map
    in compiled code."""
    if hash_ids_col is None or not hash_block_tokens:
        return no_request_hashes()
    try:
        flat, off, cnt = flat_block_ids(hash_ids_col, prompt_tokens, hash_block_tokens, block_size)
    except (ValueError, TypeError, OverflowError) as e:
        raise KernelInputError(f"hash_ids: {e}") from None
    bad = np.flatnonzero((flat < 0) | (flat > MAX_SHARED_ID))
    if bad.size:
        row = int(np.searchsorted(off + cnt, bad[0], side="right"))
        raise KernelInputError(f"row {row + 1}: hash_ids: block id {int(flat[bad[0]])} outside 0..2^62-1")
    return RequestHashes(flat, off, cnt)


def trace_refusal(trace, err: KernelInputError, instance_id: str | None = None,
                  step: int | None = None) -> BadInput:
    """The refusal of ``trace`` when a kernel refused what its tables fed it:
    named by the trace's step_items file (the batches that contradict the
    requests), with the instance and step when known."""
    where = "".join([f" (instance {instance_id}" if instance_id is not None else "",
                     f", step {step}" if step is not None and instance_id is not None else "",
                     ")" if instance_id is not None else ""])
    msg = str(err)
    column = "hash_ids" if "hash_ids" in msg else "request_id"
    name = "requests" if column == "hash_ids" else "step_items"
    path = trace.file(name) if hasattr(trace, "file") else Path(str(trace))
    return BadInput(path, None, column, f"the steps contradict the requests: {msg}{where}")
