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

- ``none``: no accuracy model: every model's accuracy is 1 (realised and
  predicted), so a request's utility is ``1 - lambda * cost``: routing
  trades cost against the SLO alone, and OnTimeUtility still rewards a
  request served on time (with accuracy 0 it would reward missing the
  SLO: every utility negative). For a user's own models, which the
  accuracy model does not know: an accuracy made up for them would steer
  routing. Its reports lead with SLO attainment and goodput.
- a quality file (``--quality FILE``): the user's own accuracy per model
  and task, a CSV with columns ``model,task,accuracy`` (``#`` lines are
  comments). Task ``*`` covers every task without a row of its own, and a
  trace without a ``task`` column reads ``*`` alone. The file must name
  exactly the pool's models: a model the pool lacks is refused (a
  misspelt name would otherwise leave the real one without a row), and so
  is a pool model without a row. Realised and predicted accuracy are both
  the table's (an expected accuracy per model and task: routers are told
  the mean, and the metrics count the mean).

The default is ``table`` when the trace has a quality table naming the
pool's models, else ``model`` when the accuracy model knows every model of
the pool, else ``none`` (the note says which, and why). A trace's table
that names none of the pool's models (a generated workload's, made for the
qwen3 models, replayed on a pool of other models) is not the pool's: the
default passes it by and says so; ``--quality table`` refuses it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from traces.policies.tasks import QWEN3_MODELS, TASKS

QUALITY_POLICIES = ("model", "table", "none", "FILE")
QUALITY_NAMES = QUALITY_POLICIES[:3]  # the policies by name; anything else given is a quality file
QUALITY_FILE_COLUMNS = ("model", "task", "accuracy")
ANY_TASK = "*"
QUALITY_FILE_MAX_BYTES = 16 << 20  # a row per model and task: a few KB; larger is not a quality file
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


@dataclass(frozen=True)
class QualityFile:
    """A user's accuracy per (model, task), as read from its CSV."""

    path: str
    accuracy: dict[tuple[str, str], float]  # (model, task) -> accuracy in [0, 1]
    rows: dict[tuple[str, str], int]  # (model, task) -> its 1-based line in the file

    @property
    def models(self) -> list[str]:
        return list(dict.fromkeys(m for m, _ in self.accuracy))

    def lookup(self, model: str, tasks: np.ndarray | None, n: int) -> np.ndarray:
        """Each request's accuracy for ``model`` (``tasks``: the requests'
        task labels, None: a trace without them). ValueError names the
        first (model, task) the file does not cover."""
        fallback = self.accuracy.get((model, ANY_TASK))
        if tasks is None:
            if fallback is None:
                raise ValueError(f"quality file {self.path}: the requests carry no task and model {model} has no "
                                 f"'{ANY_TASK}' row (the accuracy for any task)")
            return np.full(n, fallback)
        codes, names = pd.factorize(pd.Series(tasks, dtype=object), sort=True)  # missing task: code -1
        per = np.empty(len(names) + 1)
        for k, t in enumerate([*names, None]):
            a = self.accuracy.get((model, str(t)), fallback) if t is not None else fallback
            if a is None and (k < len(names) or (codes < 0).any()):
                what = f"task {t}" if t is not None else "requests without a task"
                raise ValueError(f"quality file {self.path}: no accuracy for model {model} on {what} (add a row, "
                                 f"or a '{ANY_TASK}' row for every task without one)")
            per[k] = np.nan if a is None else a
        return per[codes]  # code -1 reads the last entry: the fallback


def is_quality_file(policy: str | None) -> bool:
    """Whether a ``--quality`` value names a file rather than a policy."""
    return policy is not None and policy not in QUALITY_NAMES


def read_quality_file(path: str) -> QualityFile:
    """Parse a quality file; ``BadInput`` names its line and column."""
    import csv
    import math

    from traces.errors import BadInput
    from traces.files.paths import read_text

    text = read_text(path, "--quality", max_bytes=QUALITY_FILE_MAX_BYTES)
    lines = [(i, line) for i, line in enumerate(text.splitlines(), 1)
             if line.strip() and not line.lstrip().startswith("#")]
    if not lines:
        raise BadInput(path, None, "model", "empty: a quality file is a header model,task,accuracy and a row per "
                                            "model and task")
    parsed = list(csv.reader([line for _, line in lines]))
    header = [h.strip() for h in parsed[0]]
    for col in header:
        if col not in QUALITY_FILE_COLUMNS:
            raise BadInput(path, lines[0][0], col, f"unknown column (a quality file has {', '.join(QUALITY_FILE_COLUMNS)})")
    for col in QUALITY_FILE_COLUMNS:
        if header.count(col) != 1:
            raise BadInput(path, lines[0][0], col, "missing column" if col not in header else "column given twice")
    at = {c: header.index(c) for c in QUALITY_FILE_COLUMNS}
    accuracy: dict[tuple[str, str], float] = {}
    rows: dict[tuple[str, str], int] = {}
    for (line_no, _), fields in zip(lines[1:], parsed[1:]):
        if len(fields) != len(header):
            raise BadInput(path, line_no, "model", f"{len(fields)} fields, the header has {len(header)}")
        model, task, raw = (fields[at[c]].strip() for c in QUALITY_FILE_COLUMNS)
        for col, v in (("model", model), ("task", task)):
            if not v:
                raise BadInput(path, line_no, col, f"empty (task {ANY_TASK} stands for every task)" if col == "task"
                               else "empty")
        try:
            acc = float(raw)
        except ValueError:
            acc = math.nan
        if not (math.isfinite(acc) and 0.0 <= acc <= 1.0):
            raise BadInput(path, line_no, "accuracy", f"must be a number in [0, 1], got {raw[:40]!r}")
        if (model, task) in accuracy:
            raise BadInput(path, line_no, "task", f"model {model}, task {task} given twice (first on line "
                                                  f"{rows[(model, task)]})")
        accuracy[(model, task)] = acc
        rows[(model, task)] = line_no
    if not accuracy:
        raise BadInput(path, None, "model", "no rows: a row per model and task (task * for any task)")
    return QualityFile(str(path), accuracy, rows)


def check_quality_models(qf: QualityFile, models: list[str]) -> None:
    """The file names exactly the pool's models (``BadInput``): a model the
    pool lacks (often a misspelling of one it has) and a pool model without
    a row are both refused, naming the model."""
    from traces.errors import BadInput

    pool = list(dict.fromkeys(models))
    for m in qf.models:
        if m not in pool:
            line = min(r for (mm, _), r in qf.rows.items() if mm == m)
            raise BadInput(qf.path, line, "model", f"{m}: the pool has no such model (its models: {', '.join(pool)}); "
                                                   "drop its rows or correct the name")
    for m in pool:
        if m not in qf.models:
            raise BadInput(qf.path, None, "model", f"no row for the pool's model {m} (every model of the pool needs "
                                                   "its accuracy)")


def quality_file(path: str, models: list[str]) -> QualityFile:
    """Read a quality file and check it against the pool's models."""
    qf = read_quality_file(path)
    check_quality_models(qf, models)
    return qf


def fixed_accuracy(policy: str | None, models: list[str]) -> dict[str, float]:
    """Per model, the accuracy a live request that states none gets
    (``latroute route``, whose requests carry no task): 1 under ``none``,
    the file's ``*`` row under a quality file, {} for the other policies."""
    if policy == "none":
        return {m: 1.0 for m in models}
    if policy is None or policy in ("model", "request"):  # drawn per request; route's refusal of a silent one
        return {}
    qf = quality_file(policy, models)
    return {m: float(qf.lookup(m, None, 1)[0]) for m in dict.fromkeys(models)}


def _names_pool(quality: pd.DataFrame | None, models: list[str]) -> bool:
    return quality is not None and "model" in quality and bool(
        quality["model"].isin(models).to_numpy(dtype=bool, na_value=False).any())


def quality_table(requests: pd.DataFrame, quality: pd.DataFrame | None, models: list[str], policy: str | None,
                  seed: int) -> QualityTable:
    """The quality table the replay uses under ``policy`` (None: the
    default; a path: a quality file). Raises ValueError for a partial table
    or an unknown model, ``BadInput`` for a bad quality file."""
    models = list(dict.fromkeys(models))  # a model's replicas share its accuracy: one draw per model, not per instance
    n = len(requests)
    rid = requests["request_id"].to_numpy()
    if is_quality_file(policy):
        qf = quality_file(policy, models)
        tasks = requests["task"].to_numpy(dtype=object) if "task" in requests else None
        cols = [qf.lookup(m, tasks, n) for m in models]
        return QualityTable(quality_frame(rid, models, cols, [c.copy() for c in cols]), "file",
                            f"quality file {qf.path}: accuracy per model and task, realised = predicted (mean over "
                            "the requests: " + ", ".join(f"{m} {c.mean():.3f}" for m, c in zip(models, cols)) + ")")
    means = one_task_accuracy()
    unknown = [m for m in models if m not in means]
    named = _names_pool(quality, models)
    chosen = policy or ("table" if named else "none" if unknown else "model")
    passed_by = (policy is None and quality is not None and not named
                 and " (the trace's quality table names none of the pool's models)")
    if chosen == "none":
        ones = [np.ones(n) for _ in models]
        how = ("default: the trace has no quality table for these models and the accuracy model knows only "
               f"{', '.join(QWEN3_MODELS)}, not {unknown[0]}" if policy is None else "--quality none")
        return QualityTable(quality_frame(rid, models, ones, [o.copy() for o in ones]), "none",
                            f"no quality table ({how}): every model's accuracy is 1, so the utility is "
                            "1 - lambda * cost; SLO attainment and goodput lead")
    if chosen == "table":
        if quality is None:
            raise ValueError("--quality table needs a quality table; the trace has none (use model, none or a "
                             "quality file)")
        why = missing_rows(requests, quality, models)
        if why:
            raise ValueError(f"quality table {why} (a missing row would count as accuracy 0; give a quality file "
                             "or --quality none)")
        return QualityTable(quality, "table", "quality table (the trace's per-request accuracies)")
    if unknown:
        raise ValueError(f"--quality model knows only {', '.join(QWEN3_MODELS)}, not {unknown[0]} "
                         "(give a quality file, or --quality none: every accuracy 1, the utility 1 - lambda * cost)")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xACC]))
    acc, hat = draw_accuracy([np.full(n, means[m]) for m in models], rng)
    note = ("quality model: the generator's accuracy model, requests as one task (mean over the four tasks: "
            + ", ".join(f"{m} {means[m]:.3f}" for m in models) + ")" + (passed_by or ""))
    return QualityTable(quality_frame(rid, models, acc, hat), "model", note)
