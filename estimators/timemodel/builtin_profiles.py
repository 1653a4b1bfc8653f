"""Built-in batch-time profiles of pool ``qwen3-h100`` (the paper's setup, docs/results/paper.md).

Coefficients are the paper's six-term H100 fits. No H100 residuals are at
hand, so the noise model is a stated one: lognormal jitter with
sigma 0.05 (in line with the ~4% batch-time MAPE reported on H100) and stalls
with probability 0.001 that add 3x the typical step time.

Baseline parameters are derived from the coefficients on reference batches
(a lone 8192-token prefill for theta_pre; 64 decodes at 1500 tokens of
context for the mean decode step), since there is no trace to measure them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from estimators.timemodel.features import FORMS, design_matrix
from traces.datamodel.step_aggregates import item_terms

# name -> (b0, P, D, sum c, sum p^2, sum c^2), seconds
H100_SIX: dict[str, tuple[float, ...]] = {
    "qwen3-0.6b-h100": (2.58e-3, 2.03e-6, 1.69e-5, 3.54e-8, 1.89e-10, 1.58e-13),
    "qwen3-8b-h100": (7.30e-3, 2.08e-5, 2.56e-5, 4.65e-8, 5.12e-10, 2.69e-13),
    "qwen3-32b-h100": (1.43e-2, 5.29e-5, 6.30e-5, 3.69e-8, 8.77e-10, 4.52e-13),
}
H100_NOISE = {"kind": "lognormal+stalls", "log_mu": 0.0, "log_sigma": 0.05, "p_stall": 0.001,
              "stall_excess_mean": 3.0, "stall_excess_quantiles": {"0": 3.0, "1": 3.0}}


def batch_time(form: str, coef, tokens, computed_before, prompt_tokens) -> float:
    """Typical time of one batch given its items (for reference batches)."""
    terms = item_terms(np.asarray(tokens), np.asarray(computed_before), np.asarray(prompt_tokens))
    row = pd.DataFrame({k: [int(v.sum())] for k, v in terms.items()})
    return float((design_matrix(row, form) @ np.asarray(coef))[0])


def reference_derived(form: str, coef) -> dict:
    prefill = batch_time(form, coef, [8192], [0], [8192])
    decode = batch_time(form, coef, [1] * 64, [1500] * 64, [1000] * 64)
    return {"theta_pre_tokens_per_s": 8192 / prefill, "mean_decode_step_s": decode,
            "source": "reference batches: one 8192-token prefill; 64 decodes at context 1500"}


def _builtin(name: str, coef: tuple[float, ...]) -> dict:
    return {
        "profile_version": 1,
        "name": name,
        "form": "six",
        "coefficients": {t.name: {"value": v, "unit": t.unit, "doc": t.doc} for t, v in zip(FORMS["six"], coef)},
        "noise": dict(H100_NOISE),
        "expected": {"p_stall": 0.001, "stall_excess_mean": 3.0},
        "fitted_on": {"source": "the paper's H100 fits (arXiv 2607.18253; docs/results/paper.md)"},
        "metrics": {},
        "derived": reference_derived("six", coef),
    }


BUILTIN_PROFILES: dict[str, dict] = {name: _builtin(name, coef) for name, coef in H100_SIX.items()}
