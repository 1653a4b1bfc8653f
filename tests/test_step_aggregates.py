"""Per-step batch aggregates, checked by hand."""
from __future__ import annotations

import pandas as pd

from traces.datamodel.step_aggregates import step_aggregates


def test_hand_worked_batch():
    # step 0: a prefill chunk of 100 after 50 computed, a decode at context 300,
    # a recompute chunk (computed_before >= prompt, several tokens) of 4 at 20.
    # step 1: one decode at context 10.
    items = pd.DataFrame({
        "instance_id": ["i"] * 4,
        "step": [0, 0, 0, 1],
        "request_id": [1, 2, 3, 2],
        "tokens": [100, 1, 4, 1],
        "computed_before": [50, 300, 20, 10],
        "prompt_tokens": [400, 250, 10, 5],
    })
    agg = step_aggregates(items).set_index("step")
    s0 = agg.loc[0]
    assert s0["num_seqs"] == 3
    assert s0["prefill_tokens"] == 104 and s0["decode_tokens"] == 1
    assert s0["sum_ctx"] == 370
    assert s0["sum_ctx_sq"] == 50**2 + 300**2 + 20**2
    assert s0["sum_prefill_sq"] == 100**2 + 4**2
    assert s0["sum_decode_ctx"] == 300
    assert s0["sum_prefill_attn"] == (100 * 50 + 100 * 101 // 2) + (4 * 20 + 4 * 5 // 2)
    s1 = agg.loc[1]
    assert (s1["num_seqs"], s1["prefill_tokens"], s1["decode_tokens"], s1["sum_decode_ctx"]) == (1, 0, 1, 10)


def test_step_sums_agree_with_the_group_by():
    """The twin's per-step sums (contiguous runs) equal the group-by's, steps without items included, and
    items out of order fall back to it."""
    import numpy as np

    from traces.datamodel.step_aggregates import AGGREGATE_COLUMNS, step_sums

    rng = np.random.default_rng(7)
    for _ in range(50):
        step = np.sort(rng.choice(40, size=int(rng.integers(1, 10)), replace=False)).astype(np.int64)
        item_step = np.repeat(step, rng.integers(0, 4, size=step.size))
        if not item_step.size:
            continue
        tok, comp, prompt = (rng.integers(lo, hi, item_step.size) for lo, hi in ((1, 40), (0, 90), (1, 90)))
        sums = step_sums(step, item_step, tok, comp, prompt)
        ref = step_aggregates(pd.DataFrame({"instance_id": "i", "step": item_step, "tokens": tok,
                                            "computed_before": comp, "prompt_tokens": prompt})).set_index("step")
        ref = ref[list(AGGREGATE_COLUMNS)].reindex(step, fill_value=0)
        for name in AGGREGATE_COLUMNS:
            assert sums[name].tolist() == ref[name].tolist(), name
    assert step_sums(np.array([0, 1]), np.array([1, 0]), np.ones(2), np.zeros(2), np.ones(2)) is None
