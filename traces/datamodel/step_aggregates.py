"""Per-step batch aggregates computed from step items.

The batch-time model (both the 4-term ``eq9`` and the 6-term ``six`` form)
needs only per-step sums over the sequences in the batch, so the ``steps``
table stores them; computing them here, vectorised, once for every source
(recordings and the twin) keeps the definitions in one place.

For a sequence q in a step: c_q = tokens already in its KV cache
(``computed_before``); it is a decode (d_q = 1, p_q = 0) when it has finished
its prompt and is scheduled a single token, else a prefill chunk of
p_q = ``tokens`` tokens (this includes the recompute of a preempted request).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

AGGREGATE_COLUMNS = (
    "num_seqs",
    "prefill_tokens",
    "decode_tokens",
    "sum_ctx",
    "sum_ctx_sq",
    "sum_prefill_sq",
    "sum_decode_ctx",
    "sum_prefill_attn",
)


def item_terms(tokens: np.ndarray, computed_before: np.ndarray, prompt_tokens: np.ndarray) -> dict[str, np.ndarray]:
    """Per-item terms whose per-step sums are the aggregates."""
    tokens = np.asarray(tokens, dtype=np.int64)
    c = np.asarray(computed_before, dtype=np.int64)
    is_decode = (c >= np.asarray(prompt_tokens, dtype=np.int64)) & (tokens == 1)
    d = is_decode.astype(np.int64)
    p = np.where(is_decode, 0, tokens)
    return {
        "num_seqs": np.ones_like(tokens),
        "prefill_tokens": p,
        "decode_tokens": d,
        "sum_ctx": c,
        "sum_ctx_sq": c * c,
        "sum_prefill_sq": p * p,
        "sum_decode_ctx": c * d,
        "sum_prefill_attn": p * c + p * (p + 1) // 2,
    }


def step_aggregates(items: pd.DataFrame) -> pd.DataFrame:
    """Aggregate ``step_items`` rows into one row per (instance_id, step).

    Returns columns instance_id, step and AGGREGATE_COLUMNS; steps without
    items do not appear (callers left-join onto their step list).
    """
    if items.empty:
        return pd.DataFrame({"instance_id": pd.Series(dtype="object"), "step": pd.Series(dtype="int64"),
                             **{k: pd.Series(dtype="int64") for k in AGGREGATE_COLUMNS}})
    terms = item_terms(items["tokens"].to_numpy(), items["computed_before"].to_numpy(), items["prompt_tokens"].to_numpy())
    frame = pd.DataFrame({"instance_id": items["instance_id"].to_numpy(), "step": items["step"].to_numpy(), **terms})
    out = frame.groupby(["instance_id", "step"], sort=True, observed=True).sum().reset_index()
    _refuse_overflow(items, out)
    return out


def step_sums(step: np.ndarray, item_step: np.ndarray, tokens: np.ndarray, computed_before: np.ndarray,
              prompt_tokens: np.ndarray) -> dict[str, np.ndarray] | None:
    """The aggregates of each of ``step`` (increasing) as arrays aligned with it (0 for a step without
    items), from items whose ``item_step`` is non-decreasing and names only steps in ``step``: sums over
    contiguous runs, without a group-by (the twin logs every replay's steps this way; a request-level fit
    replays hundreds of times). None where the items are not in that order or their squares could
    overflow, and for no items (the group-by's frame types are kept): ``step_aggregates`` then groups them
    (and refuses the overflow)."""
    step, item_step = np.asarray(step, dtype=np.int64), np.asarray(item_step, dtype=np.int64)
    t, c = np.asarray(tokens, dtype=np.float64), np.asarray(computed_before, dtype=np.float64)
    big = np.maximum(t, c)
    if not item_step.size or np.any(np.diff(step) <= 0) or np.any(np.diff(item_step) < 0) or \
            (big.size and float((big * big).max()) * 4 >= 2.0**62 / big.size):
        return None
    pos = np.searchsorted(step, item_step)
    if pos[-1] >= step.size or np.any(step[np.minimum(pos, step.size - 1)] != item_step):
        return None
    counts = np.bincount(pos, minlength=step.size)
    has = counts > 0
    first = (np.cumsum(counts) - counts)[has]
    out = {}
    for name, v in item_terms(tokens, computed_before, prompt_tokens).items():
        col = np.zeros(step.size, dtype=np.int64)
        col[has] = np.add.reduceat(v, first)
        out[name] = col
    return out


def _refuse_overflow(items: pd.DataFrame, out: pd.DataFrame) -> None:
    """int64 sums wrap silently: recompute them in float64 (exact enough to
    see a sum near 2**63) and raise OverflowError where one does not fit.
    Counts within traces.datamodel.limits.MAX_TOKENS keep every term below 2**50, so
    this takes more than 8,000 huge sequences in one step."""
    t = np.asarray(items["tokens"], dtype=np.float64)
    c = np.asarray(items["computed_before"], dtype=np.float64)
    big = np.maximum(t, c)
    if not len(big) or float((big * big).max()) * 4 < 2.0**62 / max(len(big), 1):
        return  # every term is small enough that no sum of them can reach 2**62
    wide = pd.DataFrame({"instance_id": items["instance_id"].to_numpy(), "step": items["step"].to_numpy(),
                         "sq": big * big + t * c + t * t})
    sums = wide.groupby(["instance_id", "step"], sort=True, observed=True)["sq"].sum().to_numpy()
    bad = np.flatnonzero(sums >= 2.0**62)
    if bad.size:
        row = out.iloc[int(bad[0])]
        raise OverflowError(f"step {row['step']}: the squared token counts of its items sum beyond int64 "
                            f"(tokens per item are at most {2**24} by traces.datamodel.limits.MAX_TOKENS)")
