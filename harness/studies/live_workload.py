"""The live study's workload for two small CPU engines, and what a run
measured, scored as ``replay`` scores the twin.

Why its own workload: the paper's tasks have prompts up to 7,000 tokens
and H100-sized SLOs; the CPU models of ``shared/models`` take prompts of a
few hundred tokens in tens to hundreds of milliseconds. The lengths are
those of ``shared/data/vllm_cpu``'s recordings (prompt lognormal, median
300, sigma 0.8, in [8, 2000]; output median 60, sigma 0.9, in [1, 400]);
each request belongs to one task of the pool file's ``notes.accuracy``
(uniformly), whose per-model mean accuracy the generator's accuracy model
draws around (``traces.policies.quality.draw_accuracy``); the SLO is the paper's rule
on the prompt length times ``slo_scale`` (the rule is an H100's; the CPU
models are slower); predicted output lengths are the generator's (true
length plus Laplace noise).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from routers.utility import DEFAULT_LAMBDA, utility_tables
from traces.policies.quality import draw_accuracy, quality_frame
from traces.policies.slo import slo_rule
from traces.workload.generator import PREDICTED_LENGTH_SCALE, predicted_lengths

PROMPT = (300.0, 0.8, 8, 2000)  # median, sigma, clip: the vllm_cpu recordings' workload
OUTPUT = (60.0, 0.9, 1, 400)


def task_accuracy(notes: dict, models: list[str]) -> dict[str, dict[str, float]]:
    """The pool file's ``notes.accuracy``: {task: {model: mean accuracy}},
    every model of the pool in every task (ValueError otherwise)."""
    acc = notes.get("accuracy")
    if not isinstance(acc, dict) or not acc:
        raise ValueError("the pool's notes have no accuracy table {task: {model: mean accuracy}}")
    for task, row in acc.items():
        missing = [m for m in models if not isinstance(row, dict) or m not in row]
        if missing:
            raise ValueError(f"notes.accuracy.{task}: no accuracy for model {missing[0]}")
        bad = [m for m in models if not 0.0 < float(row[m]) < 1.0]
        if bad:
            raise ValueError(f"notes.accuracy.{task}.{bad[0]}: must be in (0, 1)")
    return {t: {m: float(row[m]) for m in models} for t, row in acc.items()}


def _lognormal(rng: np.random.Generator, spec, n: int) -> np.ndarray:
    median, sigma, lo, hi = spec
    return np.clip(np.rint(median * np.exp(sigma * rng.standard_normal(n))), lo, hi).astype(np.int64)


def cpu_workload(n: int, rate: float, seed: int, accuracy: dict[str, dict[str, float]],
                 slo_scale: float = 4.0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``n`` Poisson arrivals at ``rate`` per second: requests (with task,
    slo_ttft_s, predicted_output_tokens) and the quality table."""
    r_arr, r_task, r_len, r_slo, r_pred, r_acc = (np.random.default_rng(s)
                                                 for s in np.random.SeedSequence(seed).spawn(6))
    arrival = np.cumsum(r_arr.exponential(1.0 / rate, n))
    tasks = list(accuracy)
    task = np.array(tasks, dtype=object)[r_task.integers(0, len(tasks), n)]
    prompt, output = _lognormal(r_len, PROMPT, n), _lognormal(r_len, OUTPUT, n)
    rid = np.arange(n, dtype=np.int64)
    requests = pd.DataFrame({"request_id": rid, "arrival_s": arrival, "prompt_tokens": prompt,
                             "output_tokens": output, "task": task,
                             "slo_ttft_s": slo_rule(prompt, r_slo) * slo_scale,
                             "predicted_output_tokens": predicted_lengths(output, PREDICTED_LENGTH_SCALE, r_pred)})
    models = list(next(iter(accuracy.values())))
    means = [np.array([accuracy[t][m] for t in task]) for m in models]
    acc, hat = draw_accuracy(means, r_acc)
    return requests, quality_frame(rid, models, acc, hat)


def measured_ontime(requests: pd.DataFrame, quality: pd.DataFrame, models: list[str], ids: list[str],
                    price_in, price_out, served: pd.DataFrame, lam: float = DEFAULT_LAMBDA) -> dict:
    """A live run scored as ``replay`` scores the twin: ``served`` has, per
    workload request_id, the ``instance_id`` it was sent to and the
    ``ttft_s`` measured (NaN: failed); requests missing from it count as
    late, as unserved ones do in the twin. Utility is the realised one
    (realised accuracy - lambda * realised cost) of the instance that
    served; on time is TTFT <= the request's SLO."""
    util = utility_tables(requests, quality, models, np.asarray(price_in, dtype=np.float64),
                          np.asarray(price_out, dtype=np.float64),
                          requests["predicted_output_tokens"].to_numpy(), lam)
    s = served.set_index("request_id").reindex(requests["request_id"].to_numpy())
    index = {name: k for k, name in enumerate(ids)}
    j = np.array([index.get(x, -1) if isinstance(x, str) else -1 for x in s["instance_id"]], dtype=np.int64)
    ttft = s["ttft_s"].to_numpy(dtype=np.float64)
    slo = requests["slo_ttft_s"].to_numpy(dtype=np.float64)
    on_time = (j >= 0) & np.isfinite(ttft) & (ttft <= slo)
    rows = np.arange(len(requests))
    u = np.where(j >= 0, np.asarray(util.realised)[rows, np.maximum(j, 0)], 0.0)
    ok = np.isfinite(ttft) & (j >= 0)
    n = len(requests)
    return {"requests": n, "ontime_utility": float((u * on_time).sum() / n), "slo_attainment": float(on_time.mean()),
            "ttft_p50_s": float(np.median(ttft[ok])) if ok.any() else float("nan"),
            "ttft_p90_s": float(np.quantile(ttft[ok], 0.9)) if ok.any() else float("nan"),
            "failed": int((~ok).sum()),
            "share_by_instance": {name: float((j == k).mean()) for k, name in enumerate(ids)}}
