"""A lower bound on SFS's TTFT estimate, for pruning replicas (``routers.fleet``).

A bound is worth having only if it is cheaper than the estimate and never
above it: then an instance whose bound exceeds the SLO cannot meet it and
is not estimated, and the decision is the one without pruning. Only SFS
has one (its estimates cost a simulation; the baselines' are a formula, as
cheap as any bound). Derived from what ``estimators.sfs_kernel`` computes:

    estimate = max(t + frontend overhead + intake, 0),
    t = in-flight remainder (>= 0) + sum over simulated steps k of
        (gap_k + mult x typical_k),

with gap_1 = ``first_gap`` and gap_k = the profile's gap after it. With
every batch-time coefficient >= 0, a step's typical time is at least
c0 + c1 x (its tokens) (eq9; the six-term form: c1 per prefill token, c2 per
decode) plus the decodes' attention term, so

    t >= first_gap + (S - 1) gap + mult (S c0 + c_tok W + c2 D + c_att sdc),

W the prompt tokens that must be computed before the query's first token
(its own prompt and those of the requests waiting ahead of it: FCFS, and
without a long-prefill threshold a running request's chunk takes the
budget before a later one's, so the query's last chunk comes after theirs),
S >= ceil(W / budget) >= 1 the steps that takes, and D, sdc the decodes
certain to be in the first step (``estimators.sfs_bound_kernel.queue_work``).
Instances with prefix caching, negative coefficients or any other form get
no bound (-inf). ``tests/test_fleet_routers.py`` checks the bound
never exceeds the estimate on every decision of loaded replays.
"""
from __future__ import annotations

import math

import numpy as np

from estimators.engine.layout import C_BUDGET, C_POLICY, C_PREFIX, PREFIX_OFF
from estimators.engine.timing import FORM_EQ9, FORM_SIX
from estimators.engine.view import first_gap
from estimators.sfs import SFS, joining_intake
from estimators.sfs_bound_kernel import queue_work

V0 = 2  # estimators.engine.config.POLICIES["vllm-v0"]: prefill-first, decodes not in the first step
SLACK = 1e-9  # relative: the bound's sum and the simulation's add the same terms in another order


def _coefs(model) -> tuple[float, float, float, float] | None:
    """(c0, per token, per decode, per decode's computed token), or None."""
    c = model.coef
    if model.mult < 0 or model.gap < 0 or (c < 0).any():
        return None
    if model.form == FORM_EQ9:
        return float(c[0]), float(c[1]), float(c[1]), float(c[2])
    if model.form == FORM_SIX:
        return float(c[0]), float(min(c[1], c[2])), float(c[2]), float(c[3])
    return None


def ttft_lower_bound(est, view, t: float, prompt: int) -> float:
    """A value never above ``est.estimate(view, Query(., t, prompt))``; -inf when none is known."""
    if type(est) is not SFS:
        return -math.inf
    st = view.state
    cfg = st.cfg
    if cfg[C_PREFIX] != PREFIX_OFF:
        return -math.inf
    model = est.model
    cf = est._bound_coefs if getattr(est, "_bound_model", None) is model else None
    if cf is None:
        cf = _coefs(model)
        est._bound_model, est._bound_coefs = model, cf
    if cf is None:
        return -math.inf
    c0, c_tok, c_dec, c_att = cf
    w, d, sdc = queue_work(st.req, st.sc, cfg, st.running, st.waiting, view.inbox, view.n_inbox, est.pred_total,
                           cfg[C_POLICY] != V0)
    w += prompt
    budget = int(cfg[C_BUDGET])
    steps = max(1, -(-w // budget)) if budget > 0 else 1
    g = first_gap(t, view.infl_start, view.wake_s, model.gap)
    lb = g + (steps - 1) * model.gap + model.mult * (steps * c0 + c_tok * w + c_dec * d + c_att * sdc)
    lb += est.overhead + joining_intake(est.intake, view, prompt) * est.speed
    return max(lb * (1.0 - SLACK) - 1e-12, 0.0) if np.isfinite(lb) else -math.inf
