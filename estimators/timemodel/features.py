"""Design matrices of the token-batch time model (docs/concepts/estimators.md).

The ``steps`` table already holds every per-step sum both forms need (see
``traces.datamodel.step_aggregates``), so a form is just a choice of columns:

- ``eq9``:  b0 + b1*sum(p+d) + b2*sum(c*d) + b3*sum(p*c + p(p+1)/2)
- ``six``:  b0 + b1*P + b2*D + b3*sum(c) + b4*sum(p^2) + b5*sum(c^2)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class Term:
    name: str
    unit: str  # unit of the coefficient
    doc: str


FORMS: dict[str, tuple[Term, ...]] = {
    "eq9": (
        Term("const", "s", "fixed cost per step"),
        Term("tokens", "s/token", "sum(p_q + d_q): tokens in the batch"),
        Term("decode_ctx", "s/token", "sum(c_q * d_q): context read by decodes"),
        Term("prefill_attn", "s/token^2", "sum(p_q*c_q + p_q(p_q+1)/2): prefill attention"),
    ),
    "six": (
        Term("const", "s", "fixed cost per step"),
        Term("P", "s/token", "prefill tokens"),
        Term("D", "s/token", "decode tokens"),
        Term("sum_ctx", "s/token", "sum(c_q): tokens already cached"),
        Term("sum_prefill_sq", "s/token^2", "sum(p_q^2)"),
        Term("sum_ctx_sq", "s/token^2", "sum(c_q^2)"),
    ),
}


def term_names(form: str) -> list[str]:
    return [t.name for t in FORMS[form]]


def design_matrix(steps: pd.DataFrame, form: str) -> np.ndarray:
    """One row per step, one column per term of ``form`` (float64)."""
    if form not in FORMS:
        raise ValueError(f"unknown model form {form!r} (choose from {', '.join(FORMS)})")
    col = lambda name: steps[name].to_numpy(dtype=np.float64)  # noqa: E731
    ones = np.ones(len(steps))
    if form == "eq9":
        cols = [ones, col("prefill_tokens") + col("decode_tokens"), col("sum_decode_ctx"), col("sum_prefill_attn")]
    else:
        cols = [ones, col("prefill_tokens"), col("decode_tokens"), col("sum_ctx"), col("sum_prefill_sq"),
                col("sum_ctx_sq")]
    return np.column_stack(cols)


def step_durations(steps: pd.DataFrame) -> np.ndarray:
    return (steps["end_s"] - steps["start_s"]).to_numpy(dtype=np.float64)
