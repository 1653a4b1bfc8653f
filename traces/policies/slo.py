"""The TTFT SLO policy: each request's target tau_i when a trace may lack one.

- ``column``: the trace's ``slo_ttft_s`` (missing entries get the rule);
- ``rule``: the paper's rule on the prompt length,
  tau = clip((155 ms + 0.035 ms * p) * U[0.98, 1.02], 150 ms, 1120 ms),
  the U draws seeded (the generator uses the same rule);
- ``constant:MS``: MS milliseconds for every request (MS a finite number
  in (0, 1e9]). The rule's ~0.2-1.1 s is the paper's interactive target;
  a deployment whose TTFTs are seconds needs its own, or no router can
  meet it and the latency-aware ones degrade to their fallback;
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

SLO_POLICIES = ("rule", "column", "constant:MS", "none")
CONSTANT_MAX_MS = 1e9  # as a request's own SLO header (harness.route.inputs): beyond it, say none


def slo_constant_s(policy: str | None) -> float | None:
    """The SLO in seconds of a ``constant:MS`` policy (None for the others);
    ValueError for a malformed one: MS must be a finite number in (0, 1e9]
    (zero, negative, NaN, infinite: none is the policy without a target)."""
    if policy is None or not policy.startswith("constant:"):
        return None
    raw = policy.split(":", 1)[1]
    try:
        ms = float(raw)
    except ValueError:
        ms = float("nan")
    if not (np.isfinite(ms) and 0.0 < ms <= CONSTANT_MAX_MS):
        raise ValueError(f"{policy!r}: constant:MS needs a finite number of milliseconds in (0, {CONSTANT_MAX_MS:g}] "
                         "(for no target, use none)")
    return ms / 1e3


def check_slo_policy(policy: str | None, allowed: tuple[str, ...] = SLO_POLICIES) -> None:
    """Refuse a malformed or unknown policy before any work (ValueError);
    ``allowed``: the policies the command takes (``route`` has no column)."""
    if policy is None or policy in allowed and policy != "constant:MS":
        return
    if policy.startswith("constant:") and "constant:MS" in allowed:
        slo_constant_s(policy)
        return
    raise ValueError(f"unknown SLO policy {policy!r} (choose from {', '.join(allowed)})")


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
    check_slo_policy(policy)
    chosen = policy or default_slo_policy(requests)
    n = len(requests)
    if chosen == "none":
        return SloTargets(np.full(n, np.inf), "none", "SLO none: no TTFT target, every served request counts as on time")
    const = slo_constant_s(chosen)
    if const is not None:
        return SloTargets(np.full(n, const), chosen, f"SLO {chosen}: tau = {1e3 * const:g} ms for every request")
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


def slo_calls(estimates: pd.DataFrame, request_id: np.ndarray, tau: np.ndarray) -> dict[str, dict]:
    """Per estimator, how well its TTFT estimate calls each request's SLO
    (``estimates``: request_id, estimator, true_s, est_s; ``tau`` the SLO of
    each ``request_id``): what a latency-aware router acts on is whether
    the estimate is within the SLO, not its error in seconds.

    ``right``: share of requests whose estimate falls on the same side of
    the SLO as the measured TTFT; ``late``: requests measured late;
    ``late_called_on_time``: of those, the share estimated on time (the
    miss a hard router walks into); ``on_time_called_late``: of the on-time
    ones, the share estimated late (a cheaper instance passed over)."""
    slo = pd.Series(np.asarray(tau, dtype=np.float64), index=np.asarray(request_id))
    out: dict[str, dict] = {}
    for name, g in estimates.groupby("estimator", sort=False):
        t = slo.reindex(g["request_id"].to_numpy()).to_numpy()
        true, est = g["true_s"].to_numpy(dtype=np.float64), g["est_s"].to_numpy(dtype=np.float64)
        ok = np.isfinite(true) & np.isfinite(est) & ~np.isnan(t)
        late, called_late = true[ok] > t[ok], est[ok] > t[ok]
        n, n_late = int(ok.sum()), int(late.sum())
        out[str(name)] = {
            "n": n, "late": n_late,
            "right": float((late == called_late).mean()) if n else float("nan"),
            "late_called_on_time": float((~called_late[late]).mean()) if n_late else float("nan"),
            "on_time_called_late": float(called_late[~late].mean()) if n - n_late else float("nan"),
        }
    return out
