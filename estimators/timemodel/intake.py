"""Request intake: the engine time a new request costs at the step boundary
where it joins the scheduler, fitted on recorded step gaps.

Why: between two steps vLLM's engine loop handles the last step's outputs
and then takes in the requests that arrived (``add_request``: the request
object, its sampling state and, with prefix caching on, the hashes of its
prompt blocks) before ``schedule()``. A boundary where a request joins is
therefore longer than the median gap: on the vllm_cpu recordings 0.8-1.2 ms
against 0.2-0.4 ms without prefix caching, 2.6-3.0 ms with it (block
hashing grows with the prompt). Every query pays this once, at the boundary
where it joins, so an estimate that charges only the median gap is short by
it: a few percent of a TTFT of a few steps, a bias that a distribution's
p50 shows at once.

Fit: excess of a boundary's gap over the median gap of boundaries where
nobody joined, regressed (least squares, no intercept) on the number of
joining requests and their prompt tokens. Only boundaries whose joiners all
arrived before the previous step ended count: otherwise the gap also holds
the engine waiting for the arrival (an idle engine), not intake. Gaps above
the 99th percentile (host hiccups) are left out. Coefficients are floored
at 0 (an intake never saves time).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

MIN_JOINS = 20  # boundaries with a join needed to fit; fewer: no intake charge
TRIM_Q = 0.99


@dataclass(frozen=True)
class Intake:
    """Engine time charged at the boundary where requests join (seconds):
    ``per_request_s`` per request plus ``per_prompt_token_s`` per prompt token."""

    per_request_s: float = 0.0
    per_prompt_token_s: float = 0.0
    boundaries: int = 0  # boundaries with a join the fit rests on

    def cost(self, requests: int, prompt_tokens: int) -> float:
        return self.per_request_s * requests + self.per_prompt_token_s * prompt_tokens

    def to_json(self) -> dict:
        return {"per_request_s": self.per_request_s, "per_prompt_token_s": self.per_prompt_token_s,
                "boundaries": self.boundaries,
                "rule": "a request joining the scheduler adds per_request_s + per_prompt_token_s * prompt tokens "
                        "to the gap before the next step (request intake), on top of step_gap_s"}

    @classmethod
    def from_json(cls, d: dict) -> Intake:
        out = cls(float(d.get("per_request_s", 0.0)), float(d.get("per_prompt_token_s", 0.0)),
                  int(d.get("boundaries", 0)))
        if not (np.isfinite(out.per_request_s) and np.isfinite(out.per_prompt_token_s)) \
                or out.per_request_s < 0 or out.per_prompt_token_s < 0:
            raise ValueError("intake costs must be finite numbers >= 0")
        return out


def join_columns(steps: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """``steps`` (one trace and instance) with, per step, the requests that
    joined at the boundary before it: ``joins``, ``join_tokens`` (their
    prompt tokens) and ``join_waited`` (one of them arrived after the
    previous step ended: the gap holds waiting). Unchanged without
    ``added_s``."""
    if "added_s" not in requests or steps.empty:
        return steps
    steps = steps.sort_values("step", kind="stable")
    start = steps["start_s"].to_numpy(dtype=np.float64)
    end = steps["end_s"].to_numpy(dtype=np.float64)
    added = requests["added_s"].to_numpy(dtype=np.float64)
    ok = np.isfinite(added)
    k = np.searchsorted(start, added[ok], side="left")  # the first step starting at or after the join
    inside = k < len(start)
    k = k[inside]
    prompt = requests["prompt_tokens"].to_numpy(dtype=np.float64)[ok][inside]
    arrival = requests["arrival_s"].to_numpy(dtype=np.float64)[ok][inside]
    prev_end = np.where(k > 0, end[np.maximum(k - 1, 0)], -np.inf)
    n = len(start)
    return steps.assign(joins=np.bincount(k, minlength=n), join_tokens=np.bincount(k, weights=prompt, minlength=n),
                        join_waited=np.bincount(k, weights=(arrival > prev_end).astype(float), minlength=n) > 0)


def fit_intake(steps: pd.DataFrame) -> Intake:
    """The intake cost from steps carrying ``join_columns`` (pooled over
    ``trace`` / ``instance_id`` groups); no charge without them or with
    fewer than ``MIN_JOINS`` usable boundaries."""
    if "joins" not in steps:
        return Intake()
    keys = [k for k in ("trace", "instance_id") if k in steps]
    gap, nj, tok, waited = [], [], [], []
    for _, g in (steps.sort_values([*keys, "step"]).groupby(keys, sort=False) if keys else [(None, steps)]):
        gap.append(g["start_s"].to_numpy()[1:] - g["end_s"].to_numpy()[:-1])
        nj.append(g["joins"].to_numpy()[1:])
        tok.append(g["join_tokens"].to_numpy()[1:])
        waited.append(g["join_waited"].to_numpy()[1:])
    gap, nj, tok, waited = (np.concatenate(x) for x in (gap, nj, tok, waited))
    keep = (gap >= 0) & (gap <= np.quantile(gap, TRIM_Q)) & ~waited if gap.size else gap > 0
    base = gap[keep & (nj == 0)]
    use = keep & (nj > 0)
    if base.size == 0 or use.sum() < MIN_JOINS:
        return Intake()
    excess = gap[use] - np.median(base)
    A = np.column_stack([nj[use], tok[use]]).astype(np.float64)
    coef, *_ = np.linalg.lstsq(A, excess, rcond=None)
    if coef[1] < 0:  # no token cost: refit the per-request cost alone
        coef = np.array([float(np.sum(A[:, 0] * excess) / np.sum(A[:, 0] ** 2)), 0.0])
    if coef[0] < 0:
        coef[0] = 0.0
        coef[1] = max(0.0, float(np.sum(A[:, 1] * excess) / max(np.sum(A[:, 1] ** 2), 1e-300)))
    return Intake(float(coef[0]), float(coef[1]), int(use.sum()))
