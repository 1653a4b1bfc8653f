"""The quality policy: each (request, model)'s realised and predicted
accuracy when a trace may lack a quality table.

- ``table``: the trace's ``quality`` table (request_id, model, acc,
  acc_hat). It must be complete for the pool: a row for every request and
  every model the pool serves. A partial table is refused, because a
  missing row would silently read as accuracy 0.
- ``model``: the generator's accuracy model (Beta around a per-model mean,
  concentration 4; the prediction adds Gaussian noise, sigma 0.292, clipped
  to [0, 1]) with the trace's requests treated as one task.

"One task" takes each model's accuracy as the mean of its accuracies over
the paper's four tasks. An imported trace does not say which task a
request belongs to, and the generator's default mix weighs the four tasks
equally, so the mean is the expected accuracy of a request drawn from that
mix: the best guess without task labels. It keeps the models' order
(0.6b < 8b < 32b) and their gaps, which is what routing trades off against
cost and latency.

- ``none``: no accuracy: every model's is 0, so a request's utility is the
  cost term alone (``-lambda * cost``) and latency-aware routers trade
  cost against the SLO. For a user's own models, which the accuracy model
  does not know: an accuracy made up for them would steer routing.

The default is ``table`` when the trace has a quality table, else
``model`` when the accuracy model knows every model of the pool, else
``none`` (the note says which, and why).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from traces.tasks import QWEN3_MODELS, TASKS

QUALITY_POLICIES = ("model", "table", "none")
# Realised accuracy per (request, model) is Beta around the task's mean with
# this concentration; predicted accuracy adds Gaussian noise of this sigma,
# clipped to [0, 1], for a mean absolute error of about 0.17.
ACCURACY_CONCENTRATION = 4.0
ACC_HAT_SIGMA = 0.292


def one_task_accuracy() -> dict[str, float]:
    """Per model, the mean of its accuracies over the paper's tasks."""
    return {m: float(np.mean([t.accuracy[k] for t in TASKS.values()])) for k, m in enumerate(QWEN3_MODELS)}


def draw_accuracy(means: list[np.ndarray], rng: np.random.Generator, concentration: float = ACCURACY_CONCENTRATION,
                  sigma: float = ACC_HAT_SIGMA) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Realised and predicted accuracy per model, from per-request means
    (one array per model; drawn model by model, in this order)."""
    acc_cols, hat_cols = [], []
    for mean in means:
        acc = rng.beta(mean * concentration, (1.0 - mean) * concentration)
        acc_cols.append(acc)
        hat_cols.append(np.clip(acc + rng.normal(0.0, sigma, mean.size), 0.0, 1.0))
    return acc_cols, hat_cols


def quality_frame(request_id: np.ndarray, models: list[str], acc_cols, hat_cols) -> pd.DataFrame:
    """One row per (request, model), request-major. Every column is a
    fresh array, so the table takes them rather than copies (an hour at
    1,024 q/s is 11M rows)."""
    nm = len(models)
    return pd.DataFrame({
        "request_id": np.repeat(request_id, nm),
        "model": np.tile(np.array(models, dtype=object), len(request_id)),
        "acc": np.column_stack(acc_cols).ravel() if acc_cols else np.zeros(0),
        "acc_hat": np.column_stack(hat_cols).ravel() if hat_cols else np.zeros(0),
    }, copy=False)


@dataclass(frozen=True)
class QualityTable:
    table: pd.DataFrame
    policy: str
    note: str

    def record(self) -> dict:
        return {"policy": self.policy, "note": self.note}


def missing_rows(requests: pd.DataFrame, quality: pd.DataFrame, models: list[str]) -> str | None:
    """Why ``quality`` is not complete for these requests and models, or None."""
    for col in ("request_id", "model", "acc", "acc_hat"):
        if col not in quality:
            return f"has no {col} column"
    ids = pd.Index(requests["request_id"].to_numpy())
    # masks over the table, not filtered copies of it (an hour of fleet traffic is 11M rows, 0.35 GB a copy)
    ok = (quality["request_id"].isin(ids).to_numpy() & np.isfinite(quality["acc"].to_numpy(dtype=np.float64))
          & np.isfinite(quality["acc_hat"].to_numpy(dtype=np.float64)))
    rid, model = quality["request_id"], quality["model"]  # (compared as a column: pandas 3 holds strings in Arrow)
    for m in dict.fromkeys(models):  # replicas name their model once each: one scan per model
        have = rid[ok & (model == m).to_numpy(dtype=bool, na_value=False)].nunique()
        if have < len(ids):
            return f"partial: {len(ids) - have} of {len(ids)} requests have no accuracy for model {m}"
    return None


def quality_table(requests: pd.DataFrame, quality: pd.DataFrame | None, models: list[str], policy: str | None,
                  seed: int) -> QualityTable:
    """The quality table the replay uses under ``policy`` (None: the
    default). Raises ValueError for a partial table or an unknown model."""
    if policy is not None and policy not in QUALITY_POLICIES:
        raise ValueError(f"unknown quality policy {policy!r} (choose from {', '.join(QUALITY_POLICIES)})")
    models = list(dict.fromkeys(models))  # a model's replicas share its accuracy: one draw per model, not per instance
    means = one_task_accuracy()
    unknown = [m for m in models if m not in means]
    chosen = policy or ("table" if quality is not None else "none" if unknown else "model")
    if chosen == "none":
        n = len(requests)
        zeros = [np.zeros(n) for _ in models]
        how = ("default: the trace has no quality table and the accuracy model knows only "
               f"{', '.join(QWEN3_MODELS)}, not {unknown[0]}" if policy is None and unknown else "--quality none")
        return QualityTable(quality_frame(requests["request_id"].to_numpy(), models, zeros, zeros), "none",
                            f"no accuracy ({how}): every model's accuracy is 0, so the utility is the cost term alone")
    if chosen == "table":
        if quality is None:
            raise ValueError("--quality table needs a quality table; the trace has none (use model)")
        why = missing_rows(requests, quality, models)
        if why:
            raise ValueError(f"quality table {why} (a missing row would count as accuracy 0)")
        return QualityTable(quality, "table", "quality table (the trace's per-request accuracies)")
    if unknown:
        raise ValueError(f"--quality model knows only {', '.join(QWEN3_MODELS)}, not {unknown[0]} "
                         "(give the trace a quality table, or --quality none: the utility is the cost term)")
    n = len(requests)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xACC]))
    acc, hat = draw_accuracy([np.full(n, means[m]) for m in models], rng)
    note = ("quality model: the generator's accuracy model, requests as one task (mean over the four tasks: "
            + ", ".join(f"{m} {means[m]:.3f}" for m in models) + ")")
    return QualityTable(quality_frame(requests["request_id"].to_numpy(), models, acc, hat), "model", note)
