"""latroute's side of the peer suite: run a fixture's scenario through the
``vllm-v1`` scheduler kernel and record each step in the fixture's format.

This module is the only place the peer suite touches the kernel's Python
API (state arrays, ``schedule_step`` / ``complete_step``); when that API
moves, re-point this adapter and nothing else.
"""
from __future__ import annotations

import numpy as np

from estimators.sched_kernel import complete_step, new_batch_buffers, schedule_step
from estimators.sched_state import EV_FINISH, F_EVENT, F_PREEMPTIONS, F_RID, EngineConfig, SchedState


def engine_config(eng: dict) -> EngineConfig:
    """The fixture's engine as latroute's configuration (vLLM V1 has no
    admission watermark by default)."""
    return EngineConfig(policy="vllm-v1", max_num_batched_tokens=eng["max_num_batched_tokens"],
                        max_num_seqs=eng["max_num_seqs"], block_size=eng["block_size"],
                        num_kv_blocks=eng["num_blocks"],
                        long_prefill_token_threshold=eng["long_prefill_token_threshold"],
                        chunked_prefill=eng["chunked_prefill"], max_model_len=eng["max_model_len"])


def run_scenario(scenario: dict, num_steps: int) -> tuple[int, list[dict]]:
    """Free blocks at the start and ``num_steps`` step records.

    Requests join the waiting queue (in fixture order) before the
    ``schedule()`` of their arrival step, as in vLLM's engine loop. Their
    output length is ``max_tokens`` (the fixtures use ignore_eos)."""
    if scenario["engine"]["prefix_caching"]:
        raise NotImplementedError("prefix caching: issue 12")
    requests = scenario["requests"]
    state = SchedState.new(engine_config(scenario["engine"]), capacity=max(8, len(requests)))
    cap = len(state.running)
    out_slot, out_tok, out_cb, rejected = new_batch_buffers(cap)
    name = {}  # latroute's integer request id -> fixture id
    start_free = state.free_blocks
    records = []
    for step in range(1, num_steps + 1):
        for i, r in enumerate(requests):
            if r["arrival_step"] == step:
                state.add(i, r["prompt"], r["max_tokens"])
                name[i] = r["id"]
        preemptions = state.req[:, F_PREEMPTIONS].copy()
        rejected[0] = 0
        n = schedule_step(state.cfg, state.req, state.sc, state.running, state.waiting, out_slot, out_tok, out_cb,
                          rejected)
        slots = out_slot[:n].copy()
        preempted = sorted(name[int(state.req[s, F_RID])] for s in np.flatnonzero(state.req[:, F_PREEMPTIONS] > preemptions))
        record = {"step": step,
                  "batch": [[name[int(state.req[s, F_RID])], int(t), int(c)]
                            for s, t, c in zip(slots, out_tok[:n], out_cb[:n])],
                  "preempted": preempted,
                  "running": [name[r] for r in state.rids(state.running_slots())],
                  "waiting": [name[r] for r in state.rids(state.waiting_slots())],
                  "free_blocks_scheduled": state.free_blocks}
        complete_step(state.req, state.sc, state.running, state.free_slots, out_slot, n)
        record["finished"] = [name[int(state.req[s, F_RID])] for s in slots if state.req[s, F_EVENT] & EV_FINISH]
        record["free_blocks"] = state.free_blocks
        records.append(record)
    return start_free, records
