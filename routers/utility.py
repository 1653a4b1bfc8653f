"""Utility of sending query i to instance j (docs/concepts/routing.md).

U(i, j) = acc(i, j) - lambda * cost(i, j), cost in micro-dollars:
cost = p_i * price_in_j + o_i * price_out_j with prices in USD per million
tokens. Routers see the *predicted* utility (acc_hat, predicted output
length from the one predicted-length policy, ``traces.policies.lengths``); metrics
use the *realised* one (realised accuracy, true length).

Replicas share a column: instances of one model at the same
prices have equal utilities, so the tables hold one column per *distinct*
(model, price in, price out) and each instance points at its column
(``ByInstance``). 384 instances of three models x one hour at 1,024 q/s
were four 11 GB tables as N x J float64; they are N x 3 now. A pool with
no shared column keeps plain N x J arrays, so its results are unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

DEFAULT_LAMBDA = 5e-4


class ByInstance:
    """An N x J table stored as its K distinct columns: ``table`` (N, K)
    and ``cols`` (J,), instance j's column. Indexing reads like the N x J
    array: ``t[i]`` is query i's row over instances, ``t[rows, j]`` picks
    per query; ``np.asarray(t)`` builds the full array (small tables only)."""

    ndim = 2

    def __init__(self, table: np.ndarray, cols: np.ndarray):
        self.table = table
        self.cols = np.asarray(cols, dtype=np.int64)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.table.shape[0], len(self.cols))

    def __len__(self) -> int:
        return self.table.shape[0]

    def __getitem__(self, key):
        if isinstance(key, tuple):
            rows, j = key
            return self.table[rows, self.cols[j]]
        return self.table[key][..., self.cols]

    def column(self, j: int) -> np.ndarray:
        return self.table[:, self.cols[j]]

    def copy(self) -> ByInstance:
        return ByInstance(np.array(self.table), self.cols.copy())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self.table[:, self.cols]
        return out if dtype is None else out.astype(dtype)


Table = np.ndarray | ByInstance


@dataclass
class UtilityTables:
    predicted: Table  # (N, J)
    realised: Table  # (N, J)
    cost_realised: Table  # (N, J) micro-dollars
    acc_realised: Table  # (N, J)


def distinct_columns(models: list[str], price_in: np.ndarray, price_out: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The instances that start a distinct (model, price in, price out),
    in index order, and each instance's column among them."""
    key_of: dict = {}
    firsts: list[int] = []
    cols = np.zeros(len(models), dtype=np.int64)
    for j, (model, pin, pout) in enumerate(zip(models, price_in, price_out)):
        k = key_of.setdefault((model, repr(float(pin)), repr(float(pout))), len(firsts))  # repr: NaN == NaN
        if k == len(firsts):
            firsts.append(j)
        cols[j] = k
    return firsts, cols


def utility_tables(requests: pd.DataFrame, quality: pd.DataFrame | None, models: list[str], price_in: np.ndarray,
                   price_out: np.ndarray, pred_tokens: np.ndarray, lam: float = DEFAULT_LAMBDA) -> UtilityTables:
    """``pred_tokens``: predicted output length per request (the length
    policy's); the true ``output_tokens`` enter the realised table only."""
    firsts, cols = distinct_columns(models, price_in, price_out)
    if len(firsts) < len(models):
        t = utility_tables(requests, quality, [models[f] for f in firsts], np.asarray(price_in)[firsts],
                           np.asarray(price_out)[firsts], pred_tokens, lam)
        return UtilityTables(*(ByInstance(x, cols) for x in (t.predicted, t.realised, t.cost_realised,
                                                                t.acc_realised)))
    n, j = len(requests), len(models)
    acc = np.zeros((n, j))
    acc_hat = np.zeros((n, j))
    if quality is not None and len(quality):
        pos = pd.Series(np.arange(n), index=requests["request_id"].to_numpy())
        # masks over the table, not filtered copies of it (an hour of fleet traffic is 11M rows)
        known = quality["request_id"].isin(pos.index).to_numpy()
        rid, model_of = quality["request_id"].to_numpy(), quality["model"]  # (a column: its strings stay in Arrow)
        a, a_hat = quality["acc"].to_numpy(), quality["acc_hat"].to_numpy()
        for k, model in enumerate(models):
            sel = known & (model_of == model).to_numpy(dtype=bool, na_value=False)
            rows = pos.loc[rid[sel]].to_numpy()
            acc[rows, k] = a[sel]
            acc_hat[rows, k] = a_hat[sel]
    p = requests["prompt_tokens"].to_numpy(dtype=np.float64)[:, None]
    o_true = requests["output_tokens"].to_numpy(dtype=np.float64)[:, None]
    o_hat = np.asarray(pred_tokens, dtype=np.float64)[:, None]
    pin, pout = np.nan_to_num(price_in)[None, :], np.nan_to_num(price_out)[None, :]
    cost_hat = p * pin + o_hat * pout
    cost = p * pin + o_true * pout
    return UtilityTables(acc_hat - lam * cost_hat, acc - lam * cost, cost, acc)
