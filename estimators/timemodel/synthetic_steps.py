"""Synthetic engine steps with known ground truth.

Used to check that calibration recovers a model it did not see (tests) and,
until the engine twin exists, to give the demo steps to calibrate on. Batch
compositions are drawn wide (0-256 decodes at contexts around a per-step
scale from 50 to 20000 tokens, 0-2
prefill chunks of up to 8192 tokens) so that every term of both model forms
is identifiable.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from estimators.timemodel.features import design_matrix
from estimators.timemodel.fit import NoiseModel
from traces.datamodel.step_aggregates import AGGREGATE_COLUMNS, item_terms


def random_batches(n_steps: int, rng: np.random.Generator) -> pd.DataFrame:
    """Per-step aggregates of random batch compositions."""
    n_dec = rng.integers(0, 257, n_steps)
    n_pre = rng.choice(3, size=n_steps, p=[0.5, 0.35, 0.15])
    n_pre[(n_dec + n_pre) == 0] = 1  # every step runs something
    # a context scale per step (log-uniform 50..20000 tokens) keeps the
    # context sums from moving in lockstep with the decode count
    scale = np.exp(rng.uniform(np.log(50), np.log(20000), n_steps))
    dec_ctx = np.clip(rng.lognormal(np.log(np.repeat(scale, n_dec)), 0.5), 1, 30000).astype(np.int64)
    pre_tok = rng.integers(1, 8193, n_pre.sum())
    pre_ctx = rng.integers(0, 8001, n_pre.sum())
    step = np.concatenate([np.repeat(np.arange(n_steps), n_dec), np.repeat(np.arange(n_steps), n_pre)])
    tokens = np.concatenate([np.ones(n_dec.sum(), dtype=np.int64), pre_tok])
    computed = np.concatenate([dec_ctx, pre_ctx])
    prompt = np.concatenate([np.minimum(dec_ctx, 1), pre_ctx + pre_tok])  # decodes: prompt already done
    terms = item_terms(tokens, computed, prompt)
    out = {k: np.bincount(step, weights=v, minlength=n_steps).astype(np.int64) for k, v in terms.items()}
    return pd.DataFrame({k: out[k] for k in AGGREGATE_COLUMNS})


def synthetic_steps(form: str, coef: np.ndarray, noise: NoiseModel, n_steps: int, seed: int = 0,
                    instance_id: str = "synthetic") -> tuple[pd.DataFrame, np.ndarray]:
    """A ``steps`` table whose durations follow ``coef`` and ``noise``;
    also returns the true stall flags."""
    rng = np.random.default_rng(seed)
    steps = random_batches(n_steps, rng)
    typical = design_matrix(steps, form) @ np.asarray(coef, dtype=np.float64)
    jitter = np.exp(noise.log_mu + noise.log_sigma * rng.standard_normal(n_steps))
    stall = rng.random(n_steps) < noise.p_stall
    duration = typical * jitter + stall * typical * noise.stall_excess_mean
    end = np.cumsum(duration)
    steps.insert(0, "end_s", end)
    steps.insert(0, "start_s", end - duration)
    steps.insert(0, "step", np.arange(n_steps, dtype=np.int64))
    steps.insert(0, "instance_id", instance_id)
    steps["num_preempted"] = 0
    return steps, stall
