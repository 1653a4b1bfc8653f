"""The range of each fitted value that a request log supports.

Why: in a busy run tens of requests decode in every step, so a step's constant and its cost per
decoded token trade off along a valley of near-equal in-window loss; a search can stop anywhere in
it, and points far along it extrapolate badly to other loads. What the log itself says about any
step rules much of the valley out, whatever the load:

- *A one-token decode step is no longer than the 5th percentile of measured TPOT.* A request's TPOT
  is the mean of the steps it decoded in, each decoding at least its token, so it is at least
  ``const + D`` (the step with one decode); the 5th percentile rather than the minimum keeps a
  mis-stamped request from setting the bound.
- *A one-token decode step is no shorter than reading the weights once* (``weight_floor``), when
  the trace names the model, the GPU and its tensor parallelism; otherwise not applied (said so).
- *A step reads the KV cache of every context token it attends to* (``weight_floor.kv_read_floor``):
  the cost per cached context token (``sum_ctx``) is at least those bytes over the GPUs' bandwidth,
  under the same conditions as the weight-read floor. Why it matters: a fit window whose requests
  are still young holds short contexts, so the context term is barely seen there, and a fit can
  leave it near 0 where later, longer contexts make it count.
- *Prefill costs 0 to (TTFT - front end) / prompt tokens per token*, over the requests that arrived
  at the lowest load (fewest requests in flight, from the measured timings): at the lowest load a
  TTFT is the front end plus the prompt's own prefill, and the prefill's cost per token is at most
  what is left of it. The front end itself is at most those requests' shortest TTFT.

The search works on the logarithm of the values and evaluates ``project(values)``, a point inside
these ranges (decode clipped, then the constant given the decode; front end and prefill cost, when
together they exceed a lowest-load TTFT, scaled down by the same factor, i.e. moved along the
diagonal in log space, so that neither is driven to 0 for the other), adding a penalty for the
distance it had to move, so it is drawn back inside; a value that ends on a bound is reported as
set by the bound, not by the fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.requestlevel.weight_floor import Floor

TPOT_PERCENTILE = 5
TINY = 1e-9  # values are searched in log space: never 0
PENALTY = 1.0  # loss per unit of log-distance moved by the projection
NO_KV_FLOOR = Floor(None, "not computed")


def in_flight_at_arrival(arrival: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each request, how many others had arrived and not finished when it arrived (NaN where its
    own timing is unknown; requests with unknown ends are not counted)."""
    known = np.isfinite(end)
    a, e = np.sort(arrival[known]), np.sort(end[known])
    started = np.searchsorted(a, arrival, side="left")  # arrived strictly before
    ended = np.searchsorted(e, arrival, side="right")  # finished at or before the arrival
    out = (started - ended).astype(np.float64)
    out[~known] = np.nan
    return out


@dataclass(frozen=True)
class Bounds:
    tpot_p5: float | None  # upper bound of const + D (None: no measured TPOT)
    floor: Floor  # lower bound of const + D
    low_ttft: np.ndarray  # the lowest-load requests' TTFTs (s) and prompt lengths
    low_prompt: np.ndarray
    notes: tuple[str, ...] = field(default=())
    kv_floor: Floor = NO_KV_FLOOR  # lower bound of sum_ctx

    @classmethod
    def of(cls, traces: list, floor: Floor, kv_floor: Floor = NO_KV_FLOOR) -> Bounds:
        """The ranges from ``traces`` (``validate.RequestTrace``; a fit window's timings only)."""
        tpots, low_t, low_p = [], [], []
        for rt in traces:
            r = rt.requests
            tpots.append(rt.tpot())
            arr = r["arrival_s"].to_numpy(dtype=np.float64)
            ttft = r["ttft_s"].to_numpy(dtype=np.float64)
            end = r["finish_s"].to_numpy(dtype=np.float64) if "finish_s" in r else arr + ttft
            load = in_flight_at_arrival(arr, np.where(np.isfinite(ttft), end, np.nan))
            ok = np.isfinite(load) & np.isfinite(ttft)
            if ok.any():
                low = ok & (load == np.nanmin(load[ok]))
                low_t.append(ttft[low])
                low_p.append(r["prompt_tokens"].to_numpy(dtype=np.float64)[low])
        tp = np.concatenate(tpots) if tpots else np.empty(0)
        tp = tp[np.isfinite(tp) & (tp > 0)]
        p5 = float(np.percentile(tp, TPOT_PERCENTILE)) if tp.size else None
        notes = []
        if floor.seconds is not None and p5 is not None and floor.seconds >= p5:
            notes.append(f"weight-read floor {1e3 * floor.seconds:.2f} ms is not below the TPOT bound "
                         f"{1e3 * p5:.2f} ms: the floor is not applied")
            floor = Floor(None, f"not applied: {floor.why}, above the {TPOT_PERCENTILE}th percentile of TPOT",
                          floor.sources)
        return cls(p5, floor, np.concatenate(low_t) if low_t else np.empty(0),
                   np.concatenate(low_p) if low_p else np.empty(0), tuple(notes), kv_floor)

    def _ctx_lo(self) -> float:
        return max(self.kv_floor.seconds or 0.0, TINY)

    def _step_range(self) -> tuple[float, float]:
        hi = self.tpot_p5 if self.tpot_p5 is not None else np.inf
        return self.floor.seconds or 0.0, max(hi - TINY, 2 * TINY)

    def _p_hi(self, overhead: float) -> float:
        if not self.low_ttft.size:
            return np.inf
        return max(float(np.min((self.low_ttft - overhead) / np.maximum(self.low_prompt, 1))), TINY)

    def limits(self, values: np.ndarray) -> dict[str, tuple[float, float]]:
        """Each value's range given the others (as ``project`` takes them: decode, constant, front end,
        prefill); +inf where there is no upper bound."""
        v = np.asarray(values, dtype=np.float64)
        lo_step, hi_step = self._step_range()
        o_hi = max(float(self.low_ttft.min()), TINY) if self.low_ttft.size else np.inf
        return {"D": (TINY, hi_step - TINY), "const": (max(lo_step - v[2], TINY), max(hi_step - v[2], TINY)),
                "frontend_overhead_s": (TINY, o_hi), "P": (TINY, self._p_hi(v[4])), "sum_ctx": (self._ctx_lo(), np.inf)}

    def project(self, values: np.ndarray) -> np.ndarray:
        """The nearest point inside the ranges, taken in the order decode, constant, front end, prefill (see
        the module docstring); host values (index 5, 6) untouched."""
        v = np.array(values, dtype=np.float64)
        lo_step, hi_step = self._step_range()
        v[2] = min(max(v[2], TINY), hi_step - TINY)  # room for the constant
        v[0] = min(max(v[0], lo_step - v[2], TINY), max(hi_step - v[2], TINY))
        v[1], v[3], v[4] = max(v[1], TINY), max(v[3], self._ctx_lo()), max(v[4], TINY)
        if self.low_ttft.size:  # front end + prefill within every lowest-load TTFT: both scaled down alike
            v[4], v[1] = v[4] * self._fit_share(v[4], v[1]), v[1] * self._fit_share(v[4], v[1])
        return v

    def _fit_share(self, overhead: float, p: float) -> float:
        """The factor (at most 1) by which front end and prefill cost scale down to fit every lowest-load TTFT."""
        need = overhead + p * self.low_prompt
        return float(min(1.0, np.min(self.low_ttft / np.maximum(need, TINY))))

    def penalised(self, z: np.ndarray) -> tuple[np.ndarray, float]:
        """The projected values of the log-space point ``z`` and the penalty for the move."""
        x = np.exp(z)
        p = self.project(x)
        return p, PENALTY * float(np.abs(np.log(p) - z[:p.size]).sum())

    def at_bound(self, values: np.ndarray, rel: float = 1e-3) -> dict[str, str]:
        """The values sitting on a bound (within ``rel``), and which."""
        out = {}
        v = np.asarray(values, dtype=np.float64)
        lim = self.limits(v)
        for i, name in ((0, "const"), (2, "D")):
            lo, hi = lim[name]
            if np.isfinite(hi) and v[i] >= hi * (1 - rel):
                out[name] = "upper bound (const + D at the TPOT bound)"
            elif lo > TINY and v[i] <= lo * (1 + rel):
                out[name] = "lower bound (const + D at the weight-read floor)"
        if self.kv_floor.seconds is not None and v[3] <= self.kv_floor.seconds * (1 + rel):
            out["sum_ctx"] = "lower bound (the KV-read floor)"
        if self.low_ttft.size and self._fit_share(v[4] / (1 - rel), v[1] / (1 - rel)) < 1:
            for name in ("P", "frontend_overhead_s"):
                out[name] = "upper bound (front end + prefill = a lowest-load TTFT)"
        return out

    def describe(self) -> list[str]:
        lines = []
        if self.tpot_p5 is not None:
            lines.append(f"const + D (a one-token decode step) <= {1e3 * self.tpot_p5:.2f} ms, the "
                         f"{TPOT_PERCENTILE}th percentile of measured TPOT")
        else:
            lines.append("const + D: no upper bound (no measured TPOT)")
        if self.floor.seconds is not None:
            lines.append(f"const + D >= {1e3 * self.floor.seconds:.2f} ms, the weight-read floor ({self.floor.why})")
        else:
            lines.append(f"const + D: weight-read floor {self.floor.why}")
        if self.kv_floor.seconds is not None:
            lines.append(f"sum_ctx >= {1e9 * self.kv_floor.seconds:.1f} ns per context token, the KV-read floor "
                         f"({self.kv_floor.why})")
        else:
            lines.append(f"sum_ctx: KV-read floor {self.kv_floor.why}")
        if self.low_ttft.size:
            lines.append(f"P <= (TTFT - front end) / prompt tokens over the {self.low_ttft.size} lowest-load "
                         f"request(s) (TTFT {1e3 * self.low_ttft.min():.1f}-{1e3 * self.low_ttft.max():.1f} ms); "
                         f"front end <= {1e3 * self.low_ttft.min():.1f} ms")
        return lines + list(self.notes)

    def to_json(self) -> dict:
        return {"tpot_p5_s": self.tpot_p5, "weight_floor": self.floor.to_json(), "kv_read_floor": self.kv_floor.to_json(),
                "lowest_load_requests": int(self.low_ttft.size),
                "lowest_load_ttft_s": [float(self.low_ttft.min()), float(self.low_ttft.max())]
                if self.low_ttft.size else None, "notes": list(self.notes)}
