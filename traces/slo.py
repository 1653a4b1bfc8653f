"""The TTFT SLO policy: each request's target tau_i when a trace may lack one.

- ``column``: the trace's ``slo_ttft_s`` (missing entries get the rule);
- ``rule``: DESIGN's rule on the prompt length,
  tau = clip((155 ms + 0.035 ms * p) * U[0.98, 1.02], 150 ms, 1120 ms),
  the U draws seeded (the generator uses the same rule);
- ``none``: no target (tau = infinity): every served request is on time.
  Only on request, and the outputs say so.

The default is ``column`` when the trace has the column, else ``rule``:
imported production traces carry no SLOs, and an infinite default would
make every router look perfect in silence.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

SLO_POLICIES = ("rule", "column", "none")


def slo_rule(prompt_tokens: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """tau_i = clip((155 ms + 0.035 ms * p_i) * U[0.98, 1.02], 150 ms, 1120 ms)."""
    base = 0.155 + 0.035e-3 * prompt_tokens
    return np.clip(base * rng.uniform(0.98, 1.02, prompt_tokens.size), 0.150, 1.120)


@dataclass(frozen=True)
class SloTargets:
    seconds: np.ndarray  # (N,) tau_i, inf under ``none``
    policy: str
    note: str

    def record(self) -> dict:
        return {"policy": self.policy, "note": self.note}


def default_slo_policy(requests: pd.DataFrame) -> str:
    col = requests.get("slo_ttft_s")
    return "column" if col is not None and col.notna().any() else "rule"


def slo_targets(requests: pd.DataFrame, policy: str | None, seed: int) -> SloTargets:
    """Each request's TTFT SLO under ``policy`` (None: the default); ``seed``
    drives the rule's U[0.98, 1.02] factors."""
    if policy is not None and policy not in SLO_POLICIES:
        raise ValueError(f"unknown SLO policy {policy!r} (choose from {', '.join(SLO_POLICIES)})")
    chosen = policy or default_slo_policy(requests)
    n = len(requests)
    if chosen == "none":
        return SloTargets(np.full(n, np.inf), "none", "SLO none: no TTFT target, every served request counts as on time")
    prompt = requests["prompt_tokens"].to_numpy(dtype=np.float64)
    rule = slo_rule(prompt, np.random.default_rng(np.random.SeedSequence([seed, 0x510])))
    rule_text = "clip((155 ms + 0.035 ms * prompt) * U[0.98,1.02], 150 ms, 1120 ms)"
    if chosen == "rule":
        return SloTargets(rule, "rule", f"SLO rule: tau = {rule_text} (seeded)")
    if default_slo_policy(requests) != "column":
        raise ValueError("--slo column needs a slo_ttft_s column; the trace has none (use rule or none)")
    col = requests["slo_ttft_s"].to_numpy(dtype=np.float64)
    missing = np.isnan(col)
    note = "SLO column (slo_ttft_s" + (f"; {int(missing.sum())} missing set by the rule)" if missing.any() else ")")
    return SloTargets(np.where(missing, rule, col), "column", note)
