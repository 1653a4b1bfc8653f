"""Synthetic workload generator (``latroute trace generate``).

Produces the ``requests`` and ``quality`` tables of a trace that has not been
served yet: arrivals, task, prompt and true output lengths, the TTFT SLO,
a noisy predicted output length (what a router would know) and per-model
realised and predicted accuracy. Each ingredient draws from its own child of
one ``SeedSequence``, so changing, say, the task mix leaves the arrival
times unchanged and the same arguments always give the same bytes.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from traces.policies.quality import (
    ACC_HAT_SIGMA,
    ACCURACY_CONCENTRATION,
    draw_accuracy,
    one_task_accuracy,
    quality_frame,
)
from traces.policies.slo import slo_rule
from traces.policies.tasks import DEFAULT_MIX, OUTPUT_CLIP, PROMPT_CLIP, QWEN3_MODELS, TASKS
from traces.store import open_trace
from traces.workload.arrivals import ArrivalSpec, generate_arrivals

# Laplace scale of the additive error of predicted output lengths; with the
# floor at 1 token it gives a mean absolute error of about 200 tokens on the
# default mix (the paper's workload, arXiv 2607.18253).
PREDICTED_LENGTH_SCALE = 237.0


@dataclass(frozen=True)
class WorkloadConfig:
    requests: int | None = None
    duration_s: float | None = None
    arrivals: ArrivalSpec = field(default_factory=ArrivalSpec)
    rate_given: bool = True  # with arrivals_from: rescale times to arrivals.rate
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    seed: int = 0
    lengths_from: str | None = None
    arrivals_from: str | None = None
    predicted_length_scale: float = PREDICTED_LENGTH_SCALE
    accuracy_concentration: float = ACCURACY_CONCENTRATION
    acc_hat_sigma: float = ACC_HAT_SIGMA

    def params(self) -> dict[str, Any]:
        """JSON-ready parameters for meta.json."""
        d = asdict(self)
        d["arrivals"] = asdict(self.arrivals)
        return d


@dataclass
class Workload:
    requests: pd.DataFrame
    quality: pd.DataFrame


def _lognormal_tokens(rng: np.random.Generator, median: np.ndarray, sigma: np.ndarray, clip: tuple[int, int]) -> np.ndarray:
    x = np.exp(np.log(median) + sigma * rng.standard_normal(median.size))
    return np.clip(np.rint(x), *clip).astype(np.int64)


def _arrivals(cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    if cfg.arrivals_from is None:
        return generate_arrivals(cfg.arrivals, rng, n=cfg.requests, duration=cfg.duration_s)
    times = open_trace(cfg.arrivals_from).read("requests", ["arrival_s"])["arrival_s"].to_numpy(dtype=np.float64)
    if times.size == 0:
        raise ValueError(f"{cfg.arrivals_from}: has no requests to take arrivals from")
    times = times - times[0]
    if cfg.rate_given and times.size > 1 and times[-1] > 0:
        times = times * ((times.size - 1) / times[-1] / cfg.arrivals.rate)
    if cfg.requests is not None:
        if cfg.requests > times.size:
            raise ValueError(f"{cfg.arrivals_from}: has only {times.size} arrivals, {cfg.requests} requested")
        return times[: cfg.requests]
    if cfg.duration_s is not None:
        return times[times < cfg.duration_s]
    return times


def generate_workload(cfg: WorkloadConfig) -> Workload:
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(6)]
    r_arr, r_task, r_len, r_slo, r_pred, r_acc = rngs

    arrival = _arrivals(cfg, r_arr)
    n = arrival.size
    names = list(cfg.mix)
    task_idx = r_task.choice(len(names), size=n, p=np.array([cfg.mix[k] for k in names]))
    specs = [TASKS[k] for k in names]

    if cfg.lengths_from is not None:
        prompt, output, task = _lengths_from(cfg.lengths_from, r_len, n)
    else:
        # each parameter array lives only as long as its draw (an hour at 1,024 q/s: 30 MB apiece)
        prompt = _lognormal_tokens(r_len, np.array([s.prompt_median for s in specs])[task_idx],
                                   np.array([s.prompt_sigma for s in specs])[task_idx], PROMPT_CLIP)
        output = _lognormal_tokens(r_len, np.array([s.output_median for s in specs])[task_idx],
                                   np.array([s.output_sigma for s in specs])[task_idx], OUTPUT_CLIP)
        task = np.array(names, dtype=object)[task_idx]

    slo = slo_rule(prompt, r_slo)
    noise = r_pred.laplace(0.0, cfg.predicted_length_scale, n)
    predicted = np.maximum(np.rint(output + noise), 1).astype(np.int64)

    request_id = np.arange(n, dtype=np.int64)
    requests = pd.DataFrame(
        {
            "request_id": request_id,
            "arrival_s": arrival,
            "prompt_tokens": prompt,
            "output_tokens": output,
            "task": task,
            "slo_ttft_s": slo,
            "predicted_output_tokens": predicted,
        },
        copy=False,  # the arrays are this function's own: the table takes them, not copies
    )

    if cfg.lengths_from is not None:
        # the requests are the source's, not one of the paper's tasks: the
        # quality policy ``model`` (one task: each model's mean accuracy)
        one = one_task_accuracy()
        means = [np.full(n, one[m]) for m in QWEN3_MODELS]
    else:
        means = [np.array([s.accuracy[m] for s in specs])[task_idx] for m in range(len(QWEN3_MODELS))]
    acc_cols, hat_cols = draw_accuracy(means, r_acc, cfg.accuracy_concentration, cfg.acc_hat_sigma)
    del means
    quality = quality_frame(request_id, list(QWEN3_MODELS), acc_cols, hat_cols)
    return Workload(requests, quality)


def _lengths_from(source: str, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompt and output lengths of ``n`` requests drawn from a trace's own
    requests, labelled with where they came from: the source's task where it
    has one, else the source trace's name (the paper's four task labels would
    claim lengths, SLO rows and accuracies these requests do not have)."""
    t = open_trace(source)
    cols = ["prompt_tokens", "output_tokens"] + (["task"] if "task" in t.columns("requests") else [])
    src = t.read("requests", cols)
    if src.empty:
        raise ValueError(f"{source}: has no requests to take lengths from")
    pick = rng.integers(0, len(src), n)
    prompt = src["prompt_tokens"].to_numpy(dtype=np.int64)[pick]
    output = np.maximum(src["output_tokens"].to_numpy(dtype=np.int64)[pick], 1)
    label = Path(source).resolve().name
    if "task" in src:
        task = src["task"].astype(object).to_numpy()[pick]
        task = np.where(pd.isna(task), label, task).astype(object)
    else:
        task = np.full(n, label, dtype=object)
    return prompt, output, task


def predicted_lengths(output: np.ndarray, scale: float, rng: np.random.Generator) -> np.ndarray:
    """True length plus Laplace noise, floored at 1 (what a router knows)."""
    return np.maximum(np.rint(output + rng.laplace(0.0, scale, output.size)), 1).astype(np.int64)


def quality_table(request_id: np.ndarray, task_idx: np.ndarray, specs: list, concentration: float,
                  acc_hat_sigma: float, rng: np.random.Generator) -> pd.DataFrame:
    """Realised and predicted accuracy per (request, model), by the generator's per-task model."""
    means = [np.array([s.accuracy[m] for s in specs])[task_idx] for m in range(len(QWEN3_MODELS))]
    acc_cols, hat_cols = draw_accuracy(means, rng, concentration, acc_hat_sigma)
    return quality_frame(request_id, list(QWEN3_MODELS), acc_cols, hat_cols)


def write_workload(cfg: WorkloadConfig, out: str | Path, force: bool = False) -> dict[str, int]:
    from traces.store import TraceWriter

    wl = generate_workload(cfg)
    with TraceWriter(out, force=force) as w:
        w.meta["source"] = {"kind": "generated", "generator": "latroute trace generate"}
        w.meta["generator"] = cfg.params()
        if cfg.lengths_from is not None:
            w.meta["generator"]["policies"] = {"task": "the source's task, else its name", "slo": "rule",
                                               "quality": "model (one task)"}
        w.write_table("requests", wl.requests)
        w.write_table("quality", wl.quality)
    return w.rows
