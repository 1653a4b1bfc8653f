"""Prefix-cache-aware routers, as production gateways route.

- ``prefix-affinity``: the instance holding the longest cached prefix of the
  query (in tokens, vLLM's own lookup on the instance's live cache), ties
  broken by fewest residents (llm-d's prefix scorer followed by its load
  scorer; vLLM production-stack's prefix router).
- ``prefix-load``: llm-d's weighted sum of scores in [0, 1] per instance,
  with the weights of llm-d's default "inference scheduling" profile
  (``prefix-cache-scorer`` 3, ``queue-scorer`` 2,
  ``kv-cache-utilization-scorer`` 2):

  - prefix = cached prefix / prompt tokens;
  - queue = (max residents - residents) / (max - min) over the instances
    (1 for all when they are equal), as llm-d's queue scorer;
  - kv = 1 - KV usage (evictable cached blocks count as free, as vLLM's
    ``kv_cache_usage`` does).

  The prefix weight above the others makes a full hit win against a moderate
  load gap, while a saturated instance still loses against an idle one.

Both read an instance through ``cached_prefix_tokens(i, prompt)`` (a read-only
lookup against the live cache: no copy), ``residents`` and ``kv_usage()``.

Blind runs: on a trace whose requests name no prompt blocks (no ``hash_ids``,
as request logs without sessions) or a pool whose instances do not cache
prefixes, every lookup is 0 and these routers route on load alone
(``prefix-affinity`` then chooses exactly as ``shortest-queue``). A replay
says so once per router on stderr (``warn_if_blind``), so that a comparison
of "prefix-aware against load-only" is not read as a finding.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from routers.base import RouteInputs, Router

_WARNED: set[str] = set()  # routers already warned in this process (a sweep replays one router many times)


def prefix_blindness(caching: bool, hash_ids, hash_block_tokens: int | None) -> str | None:
    """Why a prefix-aware router would see no cached prefix in a replay, or None when it can.
    ``hash_ids``: the trace's column (None when it has none)."""
    if not caching:
        return "no instance of the pool caches prefixes"
    if hash_ids is None or not hash_block_tokens or not any(
            h is not None and len(h) for h in hash_ids):
        return "the trace has no hash_ids (no request names its prompt blocks)"
    return None


def warn_if_blind(router, caching: bool, hash_ids, hash_block_tokens: int | None) -> bool:
    """One line on stderr, once per router name and process, when ``router`` is prefix-aware and blind
    (``prefix_blindness``); True when it warned now."""
    instead = getattr(router, "blind_as", None)
    why = prefix_blindness(caching, hash_ids, hash_block_tokens) if instead else None
    if why is None or router.name in _WARNED:
        return False
    _WARNED.add(router.name)
    print(f"warning: {router.name}: {why}; it routes {instead}", file=sys.stderr)
    return True


class PrefixAffinity(Router):
    name = "prefix-affinity"
    blind_as = "exactly as shortest-queue"  # what it does when no lookup can hit (warn_if_blind)

    def choose(self, i, t, insts) -> int:
        p = int(self.inputs.prompt[i])
        return max(range(len(insts)), key=lambda j: (insts[j].cached_prefix_tokens(i, p), -insts[j].residents, -j))


@dataclass(frozen=True)
class PrefixLoadWeights:
    prefix: float = 3.0
    queue: float = 2.0
    kv: float = 2.0


class PrefixLoad(Router):
    name = "prefix-load"
    blind_as = "on its queue and KV scores alone"

    def __init__(self, inputs: RouteInputs, weights: PrefixLoadWeights = PrefixLoadWeights()):
        super().__init__(inputs)
        self.w = weights

    def choose(self, i, t, insts) -> int:
        prompt = max(int(self.inputs.prompt[i]), 1)
        res = [inst.residents for inst in insts]
        lo, hi = min(res), max(res)
        best, best_score = 0, -1.0
        for j, inst in enumerate(insts):
            queue = (hi - res[j]) / (hi - lo) if hi > lo else 1.0
            score = (self.w.prefix * inst.cached_prefix_tokens(i, prompt) / prompt + self.w.queue * queue
                     + self.w.kv * (1.0 - inst.kv_usage()))
            if score > best_score:
                best, best_score = j, score
        return best


ROUTERS = {"prefix-affinity": PrefixAffinity, "prefix-load": PrefixLoad}
