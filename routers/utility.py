"""Utility of sending query i to instance j (DESIGN section 1).

U(i, j) = acc(i, j) - lambda * cost(i, j), cost in micro-dollars:
cost = p_i * price_in_j + o_i * price_out_j with prices in USD per million
tokens. Routers see the *predicted* utility (acc_hat, predicted output
length from the one predicted-length policy, ``traces.lengths``); metrics
use the *realised* one (realised accuracy, true length).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

DEFAULT_LAMBDA = 5e-4


@dataclass
class UtilityTables:
    predicted: np.ndarray  # (N, J)
    realised: np.ndarray  # (N, J)
    cost_realised: np.ndarray  # (N, J) micro-dollars
    acc_realised: np.ndarray  # (N, J)


def utility_tables(requests: pd.DataFrame, quality: pd.DataFrame | None, models: list[str], price_in: np.ndarray,
                   price_out: np.ndarray, pred_tokens: np.ndarray, lam: float = DEFAULT_LAMBDA) -> UtilityTables:
    """``pred_tokens``: predicted output length per request (the length
    policy's); the true ``output_tokens`` enter the realised table only."""
    n, j = len(requests), len(models)
    acc = np.zeros((n, j))
    acc_hat = np.zeros((n, j))
    if quality is not None and len(quality):
        pos = pd.Series(np.arange(n), index=requests["request_id"].to_numpy())
        q = quality[quality["request_id"].isin(pos.index)]
        for k, model in enumerate(models):
            qm = q[q["model"] == model]
            rows = pos.loc[qm["request_id"].to_numpy()].to_numpy()
            acc[rows, k] = qm["acc"].to_numpy()
            acc_hat[rows, k] = qm["acc_hat"].to_numpy()
    p = requests["prompt_tokens"].to_numpy(dtype=np.float64)[:, None]
    o_true = requests["output_tokens"].to_numpy(dtype=np.float64)[:, None]
    o_hat = np.asarray(pred_tokens, dtype=np.float64)[:, None]
    pin, pout = np.nan_to_num(price_in)[None, :], np.nan_to_num(price_out)[None, :]
    cost_hat = p * pin + o_hat * pout
    cost = p * pin + o_true * pout
    return UtilityTables(acc_hat - lam * cost_hat, acc - lam * cost, cost, acc)
