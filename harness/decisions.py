"""Decision agreement: does the scheduler kernel choose exactly the batches a
real engine chose?

For every recorded step the pre-step state is rebuilt from the recording
(requests join ``waiting`` at their ``added_s`` step boundary; running order
is admission order; the recorded batches and preemptions so far are
applied), the kernel schedules a copy of it, and its batch is compared with
the recorded one: same requests, same token counts, same order. The real
state then advances by the *recorded* batch, so one disagreement cannot
cascade into the next steps.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from estimators.sched_kernel import cdiv, complete_step, new_batch_buffers, schedule_step, wait_push_back
from estimators.sched_state import (C_BLOCK, F_BLOCKS, F_COMPUTED, F_PREEMPTIONS, F_RID, F_STATUS, S_CAP,
                                    S_FREE_BLOCKS, S_NPREEMPT, S_NR, S_WHEAD, S_WN, ST_RUNNING, ST_WAITING,
                                    EngineConfig, SchedState)
from traces.store import Trace


def engine_config_of(instances: pd.DataFrame, instance_id: str) -> EngineConfig:
    row = instances.set_index("instance_id").loc[instance_id]
    get = lambda k, d: (row[k] if k in row and not pd.isna(row[k]) else d)  # noqa: E731
    return EngineConfig(
        policy=str(row["policy"]),
        max_num_batched_tokens=int(row["max_num_batched_tokens"]),
        max_num_seqs=int(row["max_num_seqs"]),
        block_size=int(row["block_size"]),
        num_kv_blocks=int(row["num_kv_blocks"]),
        long_prefill_token_threshold=int(get("long_prefill_token_threshold", 0)),
        chunked_prefill=bool(get("chunked_prefill", True)),
        max_model_len=int(get("max_model_len", 1 << 40)) or (1 << 40),
    )


@dataclass
class StepMismatch:
    step: int
    recorded: list[tuple[int, int]]
    kernel: list[tuple[int, int]]
    recorded_preempted: list[int]
    kernel_preempted: list[int]


@dataclass
class AgreementResult:
    steps: int = 0
    agree: int = 0  # same requests, tokens and order, same preemptions
    agree_as_set: int = 0  # same (request, tokens) pairs in any order
    mismatches: list[StepMismatch] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.agree / self.steps if self.steps else float("nan")

    def to_json(self, keep: int = 20) -> dict:
        return {"steps": self.steps, "agree": self.agree, "agree_as_set": self.agree_as_set, "rate": self.rate,
                "first_mismatches": [m.__dict__ for m in self.mismatches[:keep]]}


def _remove_from_running(state: SchedState, slot: int) -> None:
    nr = int(state.sc[S_NR])
    run = list(state.running[:nr])
    run.remove(slot)
    state.running[: nr - 1] = run
    state.sc[S_NR] = nr - 1


def _remove_from_waiting(state: SchedState, slot: int) -> None:
    order = [int(s) for s in state.waiting_slots() if s != slot]
    state.sc[S_WHEAD] = 0
    state.sc[S_WN] = 0
    for s in order:
        wait_push_back(state.sc, state.waiting, s)


def _apply_recorded(state: SchedState, slot_of: dict[int, int], items: np.ndarray, preempted: list[int]) -> None:
    """Advance ``state`` by a recorded batch as vLLM did at schedule time."""
    b = int(state.cfg[C_BLOCK])
    for rid in preempted:
        s = slot_of[rid]
        _remove_from_running(state, s)
        state.sc[S_FREE_BLOCKS] += state.req[s, F_BLOCKS]
        state.req[s, F_BLOCKS] = 0
        state.req[s, F_COMPUTED] = 0
        state.req[s, F_STATUS] = ST_WAITING
        state.req[s, F_PREEMPTIONS] += 1
        state.sc[S_WHEAD] = (state.sc[S_WHEAD] - 1) % state.sc[S_CAP]  # push front
        state.waiting[state.sc[S_WHEAD]] = s
        state.sc[S_WN] += 1
    for rid, tokens, computed_before in items:
        s = slot_of[int(rid)]
        if state.req[s, F_STATUS] == ST_WAITING:
            _remove_from_waiting(state, s)
            state.running[state.sc[S_NR]] = s
            state.sc[S_NR] += 1
            state.req[s, F_STATUS] = ST_RUNNING
        state.req[s, F_COMPUTED] = computed_before + tokens
        need = cdiv(int(computed_before + tokens), b) - int(state.req[s, F_BLOCKS])
        if need > 0:
            state.req[s, F_BLOCKS] += need
            state.sc[S_FREE_BLOCKS] -= need


def decision_agreement(trace: Trace, instance_id: str | None = None) -> AgreementResult:
    instances = trace.read("instances")
    instance_id = instance_id or str(instances["instance_id"].iloc[0])
    engine = engine_config_of(instances, instance_id)
    reqs = trace.read("requests")
    reqs = reqs[reqs["instance_id"] == instance_id] if "instance_id" in reqs else reqs
    joined = reqs["added_s"] if "added_s" in reqs else reqs["arrival_s"]
    order = np.argsort(joined.to_numpy(), kind="stable")
    rid = reqs["request_id"].to_numpy()[order]
    join_t = joined.to_numpy()[order]
    prompt = reqs["prompt_tokens"].to_numpy()[order]
    target = reqs["output_tokens"].to_numpy()[order]
    steps = trace.read("steps")
    steps = steps[steps["instance_id"] == instance_id].sort_values("step")
    items = trace.read("step_items")
    items = items[items["instance_id"] == instance_id]
    pre = trace.read("preemptions") if trace.has("preemptions") else pd.DataFrame(columns=["instance_id", "step", "request_id"])
    pre = pre[pre["instance_id"] == instance_id]
    items_by_step = {k: g[["request_id", "tokens", "computed_before"]].to_numpy() for k, g in items.groupby("step", sort=False)}
    pre_by_step = {k: g["request_id"].tolist() for k, g in pre.groupby("step", sort=False)}

    state = SchedState.new(engine, capacity=max(64, len(reqs) + 1))
    out_slot, out_tok, out_cb, rejected = new_batch_buffers(int(state.sc[S_CAP]))
    slot_of: dict[int, int] = {}
    result = AgreementResult()
    ptr = 0
    for step, start in zip(steps["step"].to_numpy(), steps["start_s"].to_numpy()):
        while ptr < len(rid) and join_t[ptr] <= start:
            slot_of[int(rid[ptr])] = state.add(int(rid[ptr]), int(prompt[ptr]), int(target[ptr]))
            ptr += 1
        rec_items = items_by_step.get(step, np.zeros((0, 3), dtype=np.int64))
        rec_pre = pre_by_step.get(step, [])
        trial = state.copy()
        rejected[0] = 0
        n = schedule_step(trial.cfg, trial.req, trial.sc, trial.running, trial.waiting, out_slot, out_tok, out_cb,
                          rejected)
        kernel = [(int(trial.req[out_slot[j], F_RID]), int(out_tok[j])) for j in range(n)]
        recorded = [(int(r), int(t)) for r, t, _ in rec_items]
        kernel_pre = [int(trial.req[s, F_RID]) for s in trial.waiting_slots()[: int(trial.sc[S_NPREEMPT])]][::-1]
        result.steps += 1
        same_pre = sorted(kernel_pre) == sorted(int(r) for r in rec_pre)
        if kernel == recorded and same_pre:
            result.agree += 1
        else:
            result.mismatches.append(StepMismatch(int(step), recorded, kernel, [int(r) for r in rec_pre], kernel_pre))
        if sorted(kernel) == sorted(recorded) and same_pre:
            result.agree_as_set += 1
        _apply_recorded(state, slot_of, rec_items, rec_pre)
        slots = np.array([slot_of[int(r)] for r, _, _ in rec_items], dtype=np.int64)
        out_slot[: len(slots)] = slots
        complete_step(state.req, state.sc, state.running, state.free_slots, out_slot, len(slots))
    return result
