"""A lower bound on SFS's TTFT estimate, for pruning replicas (``routers.fleet``).

A bound is worth having only if it is cheaper than the estimate and never
above it: then an instance whose bound exceeds the SLO cannot meet it and
is not estimated, and the decision is the one without pruning. Only SFS
has one (its estimates cost a simulation; the baselines' are a formula, as
cheap as any bound). Derived from what ``estimators.sfs.kernel`` computes:

    estimate = max(t + frontend overhead + intake, 0),
    t = in-flight remainder (>= 0) + sum over simulated steps k of
        (gap_k + mult x typical_k),

with gap_1 = ``first_gap`` and gap_k = the profile's gap after it. With
every batch-time coefficient >= 0, a step's typical time is at least
c0 + c1 x (its tokens) (eq9; the six-term form: c1 per prefill token, c2 per
decode) plus the decodes' attention term, so

    t >= rem + first_gap + (S - 1) gap + mult (S c0 + c_tok W + c2 D + c_att sdc + c3 A),

W the prompt tokens that must be computed before the query's first token
(its own prompt and those of the requests waiting ahead of it: FCFS, and
without a long-prefill threshold a running request's chunk takes the
budget before a later one's, so the query's last chunk comes after theirs),
S >= ceil(W / budget) >= 1 the steps that takes, and D, sdc the decodes
certain to be in the first step (``estimators.sfs.bound_kernel.queue_work``),
A the prefill attention term of the query's and fresh waiting requests'
prompts (eq9: sum over chunks of t (c + (t + 1) / 2), at least r (r + 1) / 2
however a prompt of r tokens is chunked), rem the in-flight step's
remainder exactly as the estimate charges it.
Instances with prefix caching, negative coefficients or any other form get
no bound (-inf). ``tests/routers/test_fleet_routers.py`` checks the bound
never exceeds the estimate on every decision of loaded replays.
"""
from __future__ import annotations

import math

import numpy as np

from estimators.engine.layout import C_POLICY, C_PREFIX, PREFIX_OFF
from estimators.engine.state import StepPlan
from estimators.engine.timing import FORM_EQ9, FORM_SIX
from estimators.engine.view import first_gap
from estimators.sfs.bound_kernel import sfs_lower_bound
from estimators.sfs.estimator import SFS, joining_intake

V0 = 2  # estimators.engine.config.POLICIES["vllm-v0"]: prefill-first, decodes not in the first step
_NO_PLAN = StepPlan.new(1)
SLACK = 1e-9  # relative: the bound's sum and the simulation's add the same terms in another order


def _coefs(model) -> tuple[float, float, float, float, float] | None:
    """(c0, per token, per decode, per decode's computed token, per prefill
    attention term), or None."""
    c = model.coef
    if model.mult < 0 or model.gap < 0 or (c < 0).any():
        return None
    if model.form == FORM_EQ9:
        return float(c[0]), float(c[1]), float(c[1]), float(c[2]), float(c[3])
    if model.form == FORM_SIX:
        return float(c[0]), float(min(c[1], c[2])), float(c[2]), float(c[3]), 0.0
    return None


def ttft_lower_bound(est, view, t: float, prompt: int) -> float:
    """A value never above ``est.estimate(view, Query(., t, prompt))``; -inf when none is known."""
    if type(est) is not SFS:
        return -math.inf
    st = view.state
    cfg = st.cfg
    model = est.model
    cached = est.__dict__.get("_bound")
    if cached is None or cached[0] is not model or cached[1] is not cfg:
        cf = _coefs(model) if cfg[C_PREFIX] == PREFIX_OFF else None
        consts = None if cf is None else np.array([*cf, model.mult, model.gap, SLACK])
        cached = est.__dict__["_bound"] = (model, cfg, consts, bool(cfg[C_POLICY] != V0))
    consts = cached[2]
    if consts is None:
        return -math.inf
    intake = est.intake
    fixed = est.overhead
    if intake.per_request_s != 0.0 or intake.per_prompt_token_s != 0.0:
        fixed += joining_intake(intake, view, prompt) * est.speed
    start = view.infl_start
    g = first_gap(t, start, view.wake_s, model.gap) if start is None else model.gap
    plan = view.inflight
    n = view.infl_n if plan is not None else 0
    if n == 0:
        plan = _NO_PLAN
    return sfs_lower_bound(st.req, st.sc, cfg, st.running, st.waiting, view.inbox, view.n_inbox, est.pred_total,
                           cached[3], prompt, g, plan, n, 0.0 if start is None else t - start, model.form,
                           model.coef, consts, fixed)
