"""``StepLog``: what an engine did, step by step (the ``steps``,
``step_items`` and ``preemptions`` tables of a trace).

The twin and the ``vllm-record`` importer both build one with
``from_items`` and ``write`` it; the state rebuilder (``RecordedWalk``,
the decision check) reads one back with ``read``. ``steps.num_preempted``
is always the count of the step's rows in ``preemptions``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from traces.datamodel.schema import STEPS
from traces.datamodel.step_aggregates import AGGREGATE_COLUMNS, step_aggregates, step_sums
from traces.store import Trace, TraceWriter


@dataclass
class StepLog:
    steps: pd.DataFrame
    step_items: pd.DataFrame
    preemptions: pd.DataFrame

    @classmethod
    def from_items(cls, instance_id: str, step: np.ndarray, start_s: np.ndarray, end_s: np.ndarray,
                   item_step: np.ndarray, item_rid: np.ndarray, tokens: np.ndarray, computed_before: np.ndarray,
                   prompt_tokens: np.ndarray, pre_step: np.ndarray, pre_rid: np.ndarray) -> StepLog:
        """One instance's log: steps (number, start, end), its batches' items
        in scheduler order and its preemptions (step, request) in order."""
        items = pd.DataFrame({"instance_id": instance_id, "step": np.asarray(item_step, dtype=np.int64),
                              "request_id": np.asarray(item_rid, dtype=np.int64),
                              "tokens": np.asarray(tokens, dtype=np.int64),
                              "computed_before": np.asarray(computed_before, dtype=np.int64),
                              "prompt_tokens": np.asarray(prompt_tokens, dtype=np.int64)})
        pre = pd.DataFrame({"instance_id": instance_id, "step": np.asarray(pre_step, dtype=np.int64),
                            "request_id": np.asarray(pre_rid, dtype=np.int64)})
        step = np.asarray(step, dtype=np.int64)
        steps = pd.DataFrame({"instance_id": instance_id, "step": step,
                              "start_s": np.asarray(start_s, dtype=np.float64),
                              "end_s": np.asarray(end_s, dtype=np.float64)})
        sums = step_sums(step, item_step, tokens, computed_before, prompt_tokens)
        if sums is not None:
            steps = steps.assign(**sums)
        else:
            steps = steps.merge(step_aggregates(items), on=["instance_id", "step"], how="left")
            steps[list(AGGREGATE_COLUMNS)] = steps[list(AGGREGATE_COLUMNS)].fillna(0).astype(np.int64)
        counts = pd.Series(pre["step"].to_numpy()).value_counts()
        steps["num_preempted"] = counts.reindex(step, fill_value=0).to_numpy(dtype=np.int64)
        return cls(steps[[c.name for c in STEPS.columns]], items, pre)

    @classmethod
    def concat(cls, logs: list[StepLog]) -> StepLog | None:
        if not logs:
            return None
        return cls(*(pd.concat([getattr(g, name) for g in logs], ignore_index=True)
                     for name in ("steps", "step_items", "preemptions")))

    def write(self, writer: TraceWriter, source: str | None = None) -> None:
        writer.write_table("steps", self.steps, source=source)
        writer.write_table("step_items", self.step_items, source=source)
        writer.write_table("preemptions", self.preemptions, source=source)

    @classmethod
    def read(cls, trace: Trace, instance_id: str) -> StepLog:
        """One instance's log (steps sorted by number; a trace without a
        ``preemptions`` table had none)."""
        steps = trace.read("steps")
        steps = steps[steps["instance_id"] == instance_id].sort_values("step").reset_index(drop=True)
        items = trace.read("step_items")
        items = items[items["instance_id"] == instance_id]
        if trace.has("preemptions"):
            pre = trace.read("preemptions")
            pre = pre[pre["instance_id"] == instance_id]
        else:
            pre = pd.DataFrame({"instance_id": pd.Series(dtype=object), "step": pd.Series(dtype=np.int64),
                                "request_id": pd.Series(dtype=np.int64)})
        return cls(steps, items, pre)
