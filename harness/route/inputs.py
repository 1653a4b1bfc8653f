"""What a router is told about each request the proxy takes: its prompt
length, TTFT SLO, predicted output length and predicted utility per
backend, in the ``RouteInputs`` arrays every router reads (one row per
request, in arrival order: row ``i`` is the proxy's i-th request).

From the request when it says (headers win over body fields; the fields
live under one ``"latroute"`` object that is removed before forwarding):

========================  ==================================  ==========================
what                      header                              body field
========================  ==================================  ==========================
TTFT SLO (ms)             ``x-llm-d-slo-ttft-ms`` (llm-d's),  ``latroute.slo_ttft_ms``
                          ``x-latroute-slo-ttft-ms``
predicted accuracy        ``x-latroute-quality:               ``latroute.quality``
per model, in [0, 1]      MODEL=ACC,MODEL=ACC``               ``{MODEL: ACC}``
predicted output tokens   ``x-latroute-predicted-tokens``     ``latroute.predicted_tokens``
========================  ==================================  ==========================

Else the policies ``replay`` uses: SLO ``rule`` (DESIGN's rule on the
prompt length, its U[0.98, 1.02] factors drawn from replay's seeded stream,
one per request in arrival order), ``constant:MS`` or ``none``; quality
``model`` (the generator's accuracy model, requests as one task: qwen3
models only), ``none`` (accuracy 1) or a quality file (its ``*`` rows);
predicted length ``max-tokens`` (the request's own ``max_tokens``: a bound
every client states), ``median`` (of the output lengths the proxy has seen
finish, the request's ``max_tokens`` before any) or ``constant:N``.

The arrays are allocated once for ``capacity`` requests (and one more row,
``STAND_IN``'s, that the ``metrics`` view uses for requests it sees on a
backend but the proxy did not send): routers and their estimators keep
references to them, so they are never re-made; request ``capacity + 1`` is
refused (503).
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from routers.base import RouteInputs
from routers.utility import DEFAULT_LAMBDA
from traces.policies.quality import draw_accuracy, fixed_accuracy, one_task_accuracy
from traces.policies.slo import slo_constant_s, slo_rule

SLO_HEADERS = ("x-llm-d-slo-ttft-ms", "x-latroute-slo-ttft-ms")
QUALITY_HEADER = "x-latroute-quality"
LENGTH_HEADER = "x-latroute-predicted-tokens"
FIELD = "latroute"
ROUTE_SLO_POLICIES = ("rule", "constant:MS", "none")
ROUTE_QUALITY_POLICIES = ("model", "request", "none")  # or a quality file (traces.policies.quality)
MEDIAN_WINDOW = 1000  # finished requests the running median looks at


class RequestFieldError(ValueError):
    """A latroute header or field the proxy cannot read (400, vLLM's body)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def check_lengths_policy(text: str) -> str:
    if text in ("max-tokens", "median"):
        return text
    if text.startswith("constant:") and text[9:].isdigit() and int(text[9:]) >= 1:
        return text
    raise ValueError(f"{text!r}: choose max-tokens, median or constant:N (N >= 1)")


@dataclass(frozen=True)
class InputPolicies:
    slo: str = "rule"
    quality: str = "model"
    lengths: str = "max-tokens"
    lam: float = DEFAULT_LAMBDA
    seed: int = 0

    def record(self) -> dict:
        return {"slo": self.slo, "quality": self.quality, "lengths": self.lengths, "lambda": self.lam,
                "seed": self.seed}


def check_quality_models(policy: str, models: list[str]) -> None:
    """``quality model`` knows only the generator's models (ValueError)."""
    if policy == "model":
        means = one_task_accuracy()
        unknown = [m for m in models if m not in means]
        if unknown:
            raise ValueError(f"--quality model knows only {', '.join(means)}, not {unknown[0]}: use --quality "
                             f"request (each request says {QUALITY_HEADER})")


def _number(v, what: str, param: str, lo: float, hi: float) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = math.nan
    if isinstance(v, bool) or not (math.isfinite(x) and lo <= x <= hi):
        raise RequestFieldError(f"{what}: must be a number in [{lo:g}, {hi:g}], got {str(v)[:40]!r}", param)
    return x


def _quality_header(text: str) -> dict[str, float]:
    out = {}
    for part in text.split(","):
        model, sep, acc = part.strip().rpartition("=")
        if not sep or not model:
            raise RequestFieldError(f"{QUALITY_HEADER}: {part.strip()[:40]!r} is not MODEL=ACC", QUALITY_HEADER)
        out[model] = _number(acc, QUALITY_HEADER, QUALITY_HEADER, 0.0, 1.0)
    return out


@dataclass(frozen=True)
class Stated:
    """What one request says about itself (None: it does not say)."""

    slo_s: float | None
    quality: dict[str, float]
    predicted: int | None


def stated(headers, body: dict) -> Stated:
    """Read (and remove from ``body``) the request's own SLO, quality and
    predicted length; ``RequestFieldError`` for one it states badly."""
    extra = body.pop(FIELD, None)
    if extra is not None and not isinstance(extra, dict):
        raise RequestFieldError(f"{FIELD}: must be an object", FIELD)
    extra = extra or {}
    slo = None
    for h in SLO_HEADERS:
        if headers.get(h) is not None:
            slo = _number(headers[h], h, h, 0.0, 1e9) / 1e3
            break
    if slo is None and extra.get("slo_ttft_ms") is not None:
        slo = _number(extra["slo_ttft_ms"], f"{FIELD}.slo_ttft_ms", FIELD, 0.0, 1e9) / 1e3
    quality: dict[str, float] = {}
    if extra.get("quality") is not None:
        q = extra["quality"]
        if not isinstance(q, dict):
            raise RequestFieldError(f"{FIELD}.quality: must be an object {{MODEL: ACC}}", FIELD)
        quality = {str(m): _number(a, f"{FIELD}.quality.{m}", FIELD, 0.0, 1.0) for m, a in q.items()}
    if headers.get(QUALITY_HEADER) is not None:
        quality = {**quality, **_quality_header(headers[QUALITY_HEADER])}
    pred = None
    raw = headers.get(LENGTH_HEADER)
    if raw is None and extra.get("predicted_tokens") is not None:
        raw = extra["predicted_tokens"]
    if raw is not None:
        pred = int(_number(raw, "predicted tokens", LENGTH_HEADER, 1, 1e7))
    return Stated(slo, quality, pred)


def request_headers(slo_s: float | None, quality: dict[str, float] | None, predicted: int | None) -> dict[str, str]:
    """The headers that state a request's SLO, per-model predicted accuracy
    and predicted output length (what ``stated`` reads back): a client that
    knows them (``latroute loadgen --route-fields``) tells the proxy the
    same inputs an offline replay of its trace uses. Accuracies go with
    ``repr`` so the proxy reads the very float; the SLO in ms to 1 ns."""
    out = {}
    if slo_s is not None and math.isfinite(slo_s):
        out[SLO_HEADERS[0]] = f"{slo_s * 1e3:.6f}"
    if quality:
        out[QUALITY_HEADER] = ",".join(f"{m}={float(a)!r}" for m, a in quality.items())
    if predicted is not None:
        out[LENGTH_HEADER] = str(int(predicted))
    return out


class RequestBook:
    """The ``RouteInputs`` of every request the proxy has taken, filled
    one row per arrival (``take``)."""

    def __init__(self, models: list[str], price_in: np.ndarray, price_out: np.ndarray, policies: InputPolicies,
                 capacity: int):
        self.models, self.policies, self.capacity = models, policies, capacity
        self.price_in = np.nan_to_num(np.asarray(price_in, dtype=np.float64))
        self.price_out = np.nan_to_num(np.asarray(price_out, dtype=np.float64))
        j = len(models)
        rows = capacity + 1  # row ``capacity``: the metrics view's stand-in for requests the ledger does not know
        self.inputs = RouteInputs(prompt=np.zeros(rows, dtype=np.int64), slo=np.zeros(rows),
                                  utility=np.zeros((rows, j)), pred_total=np.ones(rows, dtype=np.int64))
        self.acc_hat = np.zeros((capacity, j))
        self.n = 0
        self._slo_rng = np.random.default_rng(np.random.SeedSequence([policies.seed, 0x510]))  # traces.policies.slo's stream
        self._acc_rng = np.random.default_rng(np.random.SeedSequence([policies.seed, 0xACC]))  # traces.policies.quality's
        self._means = one_task_accuracy() if policies.quality == "model" else {}
        self._fixed = fixed_accuracy(policies.quality, models)  # none: 1 each; a quality file: its * rows
        self._slo_s = slo_constant_s(policies.slo)  # constant:MS; None for the other policies
        self._finished: deque[int] = deque(maxlen=MEDIAN_WINDOW)

    @property
    def full(self) -> bool:
        return self.n >= self.capacity

    def take(self, prompt: int, max_tokens: int, said: Stated) -> int:
        """Row of a new request (its index for the router). A request refused
        here (``RequestFieldError``) takes no row: refusals never use up the
        capacity."""
        inp, pol = self.inputs, self.policies
        missing = [m for m in self.models if m not in said.quality]
        if missing and pol.quality == "request":
            raise RequestFieldError(f"{QUALITY_HEADER}: no accuracy for model {missing[0]} (--quality request: "
                                    "every request states every model's)", QUALITY_HEADER)
        i = self.n
        self.n += 1
        inp.prompt[i] = prompt
        if said.slo_s is not None:
            inp.slo[i] = said.slo_s
        elif pol.slo == "none":
            inp.slo[i] = np.inf
        elif self._slo_s is not None:
            inp.slo[i] = self._slo_s
        else:
            inp.slo[i] = slo_rule(np.array([prompt], dtype=np.float64), self._slo_rng)[0]
        inp.pred_total[i] = max(1, said.predicted if said.predicted is not None else self._predicted(max_tokens))
        drawn = {}
        if missing and self._means:  # the generator's model, drawn per request in arrival order
            _, hat = draw_accuracy([np.full(1, self._means[m]) for m in self.models], self._acc_rng)
            drawn = {m: float(h[0]) for m, h in zip(self.models, hat)}
        acc = np.array([said.quality.get(m, drawn.get(m, self._fixed.get(m, 0.0))) for m in self.models])
        self.acc_hat[i] = acc
        cost = prompt * self.price_in + inp.pred_total[i] * self.price_out
        inp.utility[i] = acc - pol.lam * cost
        return i

    def _predicted(self, max_tokens: int) -> int:
        pol = self.policies.lengths
        if pol.startswith("constant:"):
            return int(pol[9:])
        if pol == "median" and self._finished:
            return int(round(float(np.median(np.fromiter(self._finished, dtype=np.int64)))))
        return max_tokens

    def finished(self, output_tokens: int) -> None:
        """An output length seen to the end (the running median's history)."""
        if output_tokens > 0:
            self._finished.append(output_tokens)
