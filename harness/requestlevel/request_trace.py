"""A request-level trace as a replay needs it: arrivals, lengths and the
measured timings, checked, with what the replay was told about the engine's
prefix cache and the fleet behind the log.

Why a module of its own: the one-engine replay, the fleet's replay, the
fit and the validation all take it, and none of them should import another
to get it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from harness.requestlevel.fleet import Fleet, FleetSpec, check_against_log, logged_instances, seeds_of
from traces.errors import BadInput, BadOption
from traces.store import Trace

# cold: no prompt is cached. warm: every prompt's full blocks are in vLLM's
# prefix cache when it arrives -- the case of a benchmark that replays the
# same prompts on a server that ran them before (V1 caches prefixes by
# default, and the A100 runs at 4, 16 q/s and all at once followed the 1 q/s
# run on the same server with the same 200 prompts).
PREFIX_CACHE = ("cold", "warm")


@dataclass
class RequestTrace:
    """The columns a request-level replay needs, checked."""

    requests: pd.DataFrame  # request_id, arrival_s, prompt_tokens, output_tokens, ttft_s[, finish_s]
    source: str
    prefix_cache: str = "cold"  # PREFIX_CACHE
    fleet: Fleet | None = None  # None: one engine serves every request (harness.requestlevel.fleet)

    def warmed(self, mode: str) -> RequestTrace:
        if mode not in PREFIX_CACHE:
            raise ValueError(f"prefix cache must be one of {', '.join(PREFIX_CACHE)}, not {mode!r}")
        return replace(self, prefix_cache=mode)

    def under(self, spec: FleetSpec) -> list[RequestTrace]:
        """This trace replayed by the fleet ``spec`` states: the log's own
        assignment where it names each request's instance (checked against
        ``spec``), else one trace per distinct assignment of the stated
        policy's seeds. A fleet of several replicas whose log names no
        instance needs its assignment stated (``--assign``)."""
        logged = logged_instances(self.requests, self.source)
        if logged is not None:
            f = check_against_log(spec, logged, self.requests, self.source)
            return [replace(self, fleet=f if f.replicas > 1 else None)]
        if spec.replicas == 1:
            return [replace(self, fleet=None)]
        if spec.assign is None:
            raise BadOption("--assign", f"{self.source} does not name each request's serving instance (no "
                                        f"instance_id column), so how {spec.source}'s {spec.replicas} replicas "
                                        "shared it is a setting: give --assign round-robin|random|least-requests")
        fleets, _ = seeds_of(spec, len(self.requests))
        return [replace(self, fleet=f) for f in fleets]

    def windowed(self, window: tuple[float, float] | None) -> RequestTrace:
        """The trace with the measured timings (``ttft_s``, ``finish_s``) of the requests outside
        ``window`` (a share A:B of its requests in arrival order, ``window_mask``) blanked: every
        request is still replayed with its arrival and lengths, only the window's timings are known
        to a fit."""
        if window is None:
            return self
        keep = window_mask(len(self.requests), window)
        reqs = self.requests.copy()
        for col in ("ttft_s", "finish_s"):
            if col in reqs:
                reqs.loc[~keep, col] = np.nan
        if not np.isfinite(reqs["ttft_s"].to_numpy(dtype=np.float64)).any():
            raise BadInput(self.source, None, "ttft_s", f"no measured TTFT in the window {window[0]:g}:{window[1]:g}")
        return replace(self, requests=reqs)

    def timed(self) -> int:
        """Requests with a measured TTFT (all of them, or a fit window's)."""
        return int(np.isfinite(self.requests["ttft_s"].to_numpy(dtype=np.float64)).sum())

    @classmethod
    def of(cls, trace: Trace) -> RequestTrace:
        f = trace.file("requests")
        if not trace.has("requests"):
            raise BadInput(f, None, "requests", "a request-level trace needs this table")
        reqs = trace.read("requests")
        return cls.from_frame(reqs, str(f))

    @classmethod
    def from_frame(cls, reqs: pd.DataFrame, source: str) -> RequestTrace:
        if "ttft_s" not in reqs or not np.isfinite(reqs["ttft_s"].to_numpy(dtype=np.float64)).any():
            raise BadInput(source, None, "ttft_s", "no measured TTFT: nothing to calibrate or validate against")
        for col in ("arrival_s", "prompt_tokens", "output_tokens"):
            if col not in reqs or reqs[col].isna().any():
                raise BadInput(source, None, col, "every request needs it to be replayed")
        _check_served(reqs, source)
        reqs = reqs.sort_values(["arrival_s", "request_id"], kind="stable").reset_index(drop=True)
        return cls(reqs, source)

    def tpot(self) -> np.ndarray:
        """Measured mean time per output token after the first (NaN without finish_s)."""
        return tpot_of(self.requests, self.requests["ttft_s"].to_numpy(dtype=np.float64),
                       self.requests["finish_s"].to_numpy(dtype=np.float64) if "finish_s" in self.requests else None)


def window_mask(n: int, window: tuple[float, float] | None) -> np.ndarray:
    """Requests ``[floor(A n), floor(B n))`` of ``n`` in arrival order (all without a window): the
    split ``calibrate --from-requests --fit-window`` and ``validate --score-window`` share, so 0:0.5
    and 0.5:1 are complements."""
    keep = np.ones(n, dtype=bool)
    if window is not None:
        lo, hi = int(np.floor(window[0] * n)), int(np.floor(window[1] * n + 1e-9))
        keep[:] = False
        keep[lo:hi] = True
    return keep


def _check_served(reqs: pd.DataFrame, source: str) -> None:
    """What every measured request of a served trace satisfies, checked at
    the entry (rows are the table's, 1-based): at least one output token
    (the TTFT is that token's), and a finish not before the first token.
    A row breaking either is a corruption the twin cannot be fitted to (it
    once surfaced as a missing steps table of a temporary reconstruction)."""
    out = reqs["output_tokens"].to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~(out >= 1))
    if bad.size:
        raise BadInput(source, int(bad[0]) + 1, "output_tokens", f"{out[bad[0]]:g}: a served request has at least "
                                                                 "one output token")
    if "finish_s" in reqs:
        first = reqs["arrival_s"].to_numpy(dtype=np.float64) + reqs["ttft_s"].to_numpy(dtype=np.float64)
        fin = reqs["finish_s"].to_numpy(dtype=np.float64)
        bad = np.flatnonzero(np.isfinite(first) & np.isfinite(fin) & (fin < first - 1e-9))
        if bad.size:
            i = int(bad[0])
            raise BadInput(source, i + 1, "finish_s", f"{fin[i]:g} is before the first token (arrival + TTFT = "
                                                      f"{first[i]:g})")


def tpot_of(reqs: pd.DataFrame, ttft: np.ndarray, finish: np.ndarray | None) -> np.ndarray:
    n = len(reqs)
    if finish is None:
        return np.full(n, np.nan)
    out = reqs["output_tokens"].to_numpy(dtype=np.float64)
    dec = finish - reqs["arrival_s"].to_numpy(dtype=np.float64) - ttft
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(out > 1, dec / (out - 1), np.nan)
