"""llm-d's TTFT features, from an honest instance view.

Why these and not more: they are what llm-d's gateway sends its latency
predictor per endpoint (``llm-d-latency-predictor``'s training server, TTFT
model: ``is_queued``, ``kv_cache_percentage``, ``input_token_length``,
``num_request_waiting``, ``num_request_running``, prefill and decode
tokens in flight, ``prefix_cache_score`` and the derived
``effective_input_tokens`` = (1 - prefix score) x input length); the
comparison with SFS is only fair if the learned model sees what a
production deployment of it sees. Its pod-type category (prefill / decode
pods) is constant in latroute's aggregated pools and is left out.

Tokens in flight, as read here from the view's residents (never their true
lengths): *prefill* = prompt tokens not yet computed (the in-flight step's
counted as computed, as vLLM advances ``num_computed_tokens`` at schedule
time); *decode* = residents past their prompt, i.e. the decode tokens each
step carries.
"""
from __future__ import annotations

import numpy as np

from estimators.engine.layout import S_NR
from estimators.engine.view import InstanceView, Query

FEATURES = ("is_queued", "kv_cache_percentage", "input_token_length", "num_request_waiting", "num_request_running",
            "prefill_tokens_in_flight", "decode_tokens_in_flight", "prefix_cache_score", "effective_input_tokens")
N_FEATURES = len(FEATURES)


def query_features(view: InstanceView, q: Query) -> np.ndarray:
    """The feature row of query ``q`` on ``view`` at its arrival (float64, ``FEATURES`` order)."""
    st = view.state
    waiting = view.queued
    running = int(st.sc[S_NR])
    _, prompt, computed, _ = view.resident_progress()
    left = prompt - computed
    prefill = float(left[left > 0].sum()) if left.size else 0.0
    decode = float((left <= 0).sum()) if left.size else 0.0
    p = max(int(q.prompt), 1)
    score = min(max(st.cached_prefix_tokens(q.rid, q.prompt) / p, 0.0), 1.0)
    return np.array([1.0 if waiting > 0 else 0.0, st.kv_usage(), float(q.prompt), float(waiting), float(running),
                     prefill, decode, score, (1.0 - score) * q.prompt], dtype=np.float64)
