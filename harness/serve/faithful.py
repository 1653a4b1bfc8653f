"""Is an emulated run the offline twin's? The offline twin replayed on the
arrivals a ``serve`` recording saw, with the instance each request was
served on (``fixed_router``), and each request's TTFT both ways: equal when
the served engine took the offline twin's steps (noise off, or on with the
same seed), whatever the clients' jitter. Compare a client's TTFTs with the
``offline`` column to see what the HTTP path adds. With prefix caching,
the recording's ``hash_ids`` (and meta.json ``hash_block_tokens``) give
the twin the served prompts' blocks."""
from __future__ import annotations

import pandas as pd

from harness.twin.instance import TwinConfig
from harness.twin.pools.spec import Pool
from harness.twin.simulation import Twin, fixed_router
from traces.store import Trace


def offline_on_served(rec: Trace, pool: Pool, noise: bool = False, seed: int = 0) -> pd.DataFrame:
    """Per served request (arrival order): request_id, client_id, instance_id,
    ``served`` (the recording's ttft_s) and ``offline`` (the twin's); with
    prefix caching, ``served_cached`` and ``offline_cached`` too (the hit
    each was granted at its first scheduling)."""
    s = rec.read("requests").sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)
    index = {c.instance_id: j for j, c in enumerate(pool.instances)}
    missing = sorted(set(s["instance_id"]) - set(index))
    if missing:
        raise ValueError(f"instance {missing[0]} of the recording is not in pool {pool.name}")
    req = s[["request_id", "arrival_s", "prompt_tokens", "output_tokens"] + (["hash_ids"] if "hash_ids" in s else [])]
    res = Twin.from_pool(pool, TwinConfig(seed=seed, noise=noise, record_steps=False)).run(
        req, fixed_router(s["instance_id"].map(index).to_numpy()), hash_block_tokens=rec.meta.get("hash_block_tokens"))
    out = pd.DataFrame({"request_id": s["request_id"], "client_id": s["client_id"], "instance_id": s["instance_id"],
                        "served": s["ttft_s"], "offline": res.requests["ttft_s"].to_numpy()})
    if "cached_tokens" in s and "cached_tokens" in res.requests:
        out["served_cached"] = s["cached_tokens"]
        out["offline_cached"] = res.requests["cached_tokens"].to_numpy()
    return out
