"""The predicted-length policy: what routers and estimators are told about
output lengths they cannot know yet.

A production router never sees a request's true output length: it has a
predictor's guess (a ``predicted_output_tokens`` column), or only the
history of its own traffic. One policy, used by ``estimate``, ``replay``,
``sweep`` and the utility tables, turns a trace's requests into predicted
total output lengths:

- ``column``: the trace's ``predicted_output_tokens`` (missing entries get
  the median below);
- ``median``: the median of the trace's own output lengths for every
  request (a statistic of past traffic, which a production router knows);
- ``constant:N``: N tokens for every request;
- ``oracle``: the true output lengths. Only for bounds and error
  attribution; every output that used it says so.

The default is ``column`` when the trace has the column, else ``median``.
Lengths are floored at 1 token (every request produces one).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

LENGTH_POLICIES = ("column", "median", "constant:N", "oracle")
ORACLE_WARNING = ("WARNING: --lengths oracle: routers and estimators see the TRUE output lengths "
                  "(a bound, not something a production router can know)")


@dataclass(frozen=True)
class PredictedLengths:
    """Predicted total output length per request and how it was obtained."""

    tokens: np.ndarray  # (N,) int64, >= 1
    policy: str  # resolved policy: column | median | constant:N | oracle
    note: str  # one line for stdout

    @property
    def oracle(self) -> bool:
        return self.policy == "oracle"

    def record(self) -> dict:
        """The JSON block that result files carry."""
        return {"policy": self.policy, "oracle": self.oracle, "note": self.note}


def check_length_policy(text: str | None) -> None:
    """Refuse a malformed policy before any work starts (ValueError)."""
    if text is None or text in ("column", "median", "oracle"):
        return
    if text.startswith("constant:"):
        value = text.split(":", 1)[1]
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{text!r}: constant:N needs a whole number N >= 1")
        return
    raise ValueError(f"unknown length policy {text!r} (choose from {', '.join(LENGTH_POLICIES)})")


def default_length_policy(requests: pd.DataFrame) -> str:
    col = requests.get("predicted_output_tokens")
    return "column" if col is not None and col.notna().any() else "median"


def trace_median_output(requests: pd.DataFrame) -> int:
    true = requests["output_tokens"].to_numpy(dtype=np.float64)
    true = np.maximum(true[np.isfinite(true)], 1)
    return int(round(float(np.median(true)))) if true.size else 1


def predicted_lengths(requests: pd.DataFrame, policy: str | None = None,
                      history: pd.DataFrame | None = None) -> PredictedLengths:
    """Predicted total output lengths under ``policy`` (None: the default).
    ``history``: the requests whose output lengths make the median (default
    ``requests``; a reconstruction's warm-up copies are not the trace's own)."""
    check_length_policy(policy)
    chosen = policy or default_length_policy(requests)
    n = len(requests)
    if chosen == "oracle":
        true = np.maximum(requests["output_tokens"].to_numpy(dtype=np.int64), 1)
        return PredictedLengths(true, "oracle", ORACLE_WARNING)
    if chosen.startswith("constant:"):
        k = int(chosen.split(":", 1)[1])
        return PredictedLengths(np.full(n, k, dtype=np.int64), chosen, f"lengths constant:{k} (every request {k} tokens)")
    median = trace_median_output(requests if history is None else history)
    if chosen == "median":
        return PredictedLengths(np.full(n, median, dtype=np.int64), "median",
                                f"lengths median (the trace's median output length, {median} tokens, for every request)")
    if default_length_policy(requests) != "column":
        raise ValueError("--lengths column needs a predicted_output_tokens column; the trace has none "
                         "(use median or constant:N)")
    col = requests["predicted_output_tokens"].to_numpy(dtype=np.float64)
    missing = int(np.isnan(col).sum())
    tokens = np.where(np.isnan(col), median, np.maximum(col, 1)).astype(np.int64)
    note = "lengths column (predicted_output_tokens" + (f"; {missing} missing set to the median, {median} tokens)"
                                                        if missing else ")")
    return PredictedLengths(tokens, "column", note)
