"""The largest numbers latroute accepts from its inputs, in one place.

Every count is stored as int64 and every time as float64, and the batch
aggregates square token counts (``sum_prefill_sq``, ``sum_ctx_sq``) and sum
them over a step. A value that does not fit is refused at the boundary
rather than wrapped or rounded:

- ``MAX_TOKENS`` (2**24 = 16,777,216) bounds a request's prompt and output
  lengths and an item's tokens and context. It is above the longest
  context any model serves (about 10M tokens) and small enough that a
  squared count (< 2**50) summed over 8,000 sequences of one step still
  fits int64 exactly, and every count is exact in a float64 (< 2**53).
- ``MAX_ID`` (2**53) bounds request ids and step numbers: ids pass through
  float64 in pandas when a column has nulls, and above 2**53 two ids could
  become one.
- ``MAX_ENGINE`` (2**31 - 1) bounds engine settings (KV blocks, budgets,
  sequence counts): the kernel multiplies blocks by block size in int64.
- ``MAX_TIME_S`` (1e9 s, about 31 years) bounds times relative to a
  trace's start; a larger value is a unit error (ms or epoch time), and a
  sum of such times would lose the microseconds steps need. Sources whose
  stamps may be absolute (Unix time) are bounded by ``MAX_EPOCH_S`` before
  they are rebased to the trace start.
"""
from __future__ import annotations

MAX_TOKENS = 2**24
MAX_ID = 2**53
MAX_ENGINE = 2**31 - 1
MAX_TIME_S = 1e9
MAX_EPOCH_S = 1e11  # a source's absolute time stamps (Unix seconds until the year 5138), before rebasing
INT64_MAX = 2**63 - 1


def shown(cell: object, width: int = 40) -> str:
    """A cell for an error message: repr, cut to ``width`` characters so a
    5000-digit number still gives a one-line refusal."""
    text = repr(cell)
    return text if len(text) <= width else f"{text[:width - 8]}...({len(text)} chars)"
