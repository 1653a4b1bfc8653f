"""latroute's side of the peer suite: run a fixture's scenario through the
``vllm-v1`` scheduler kernel and record each step in the fixture's format.

This module is the only place the peer suite touches the kernel's Python
API (state arrays, ``schedule_step`` / ``complete_step``); when that API
moves, re-point this adapter and nothing else.
"""
from __future__ import annotations

import numpy as np

from estimators.engine.block_ids import RequestHashes
from estimators.engine.config import InstanceConfig
from estimators.engine.kernel import complete_step, schedule_step
from estimators.engine.layout import EV_FINISH, F_EVENT, F_PH, F_PREEMPTIONS, F_RID, F_STATUS, ST_FINISHED
from estimators.engine.releases import KERNEL_VERSION
from estimators.engine.state import SchedState, StepPlan


def engine_config(eng: dict, async_scheduling: bool = False, vllm_version: str = KERNEL_VERSION) -> InstanceConfig:
    """The fixture's engine as latroute's configuration (vLLM V1 has no
    admission watermark by default), following ``vllm_version``'s rules."""
    return InstanceConfig(policy="vllm-v1", prefix_caching=bool(eng["prefix_caching"]),
                          async_scheduling=async_scheduling, vllm_version=vllm_version,
                          max_num_batched_tokens=eng["max_num_batched_tokens"],
                        max_num_seqs=eng["max_num_seqs"], block_size=eng["block_size"],
                        num_kv_blocks=eng["num_blocks"],
                        long_prefill_token_threshold=eng["long_prefill_token_threshold"],
                        chunked_prefill=eng["chunked_prefill"], max_model_len=eng["max_model_len"],
                        scheduling_policy=eng.get("scheduling_policy", "fcfs"))


def request_ids(requests: list[dict]) -> list[int]:
    """latroute's integer request id of each fixture request: its rank in
    vLLM's request-id order (string order), the last tie-break of vLLM's
    priority queue, which the kernel breaks by its integer id. Under FCFS
    the id breaks no tie and this is the same order as the fixture's when
    its ids are, which the scenarios keep."""
    ranks = sorted(range(len(requests)), key=lambda i: requests[i]["id"])
    out = [0] * len(requests)
    for rank, i in enumerate(ranks):
        out[i] = rank
    return out


def _priority_ids(scenario: dict, plant: str | None = None) -> list[int]:
    """The kernel's request ids: ``request_ids`` under the priority policy,
    the fixture's order otherwise (the FCFS fixtures' runs keep their ids).
    ``plant`` "fixture_ids" (tests only): the fixture's order, not vLLM's
    request-id order, breaks the last tie."""
    requests = scenario["requests"]
    if scenario["engine"].get("scheduling_policy", "fcfs") == "priority" and plant != "fixture_ids":
        return request_ids(requests)
    return list(range(len(requests)))


def _add(state: SchedState, rid: int, r: dict, step: int, plant: str | None = None) -> int:
    """Fixture request ``r`` joins at ``step`` (its arrival time, as the
    generator gives vLLM) with its priority. ``plant`` (tests only) plants a
    wrong key: "no_arrival" drops the arrival time, so ties in priority go
    by request id alone."""
    if "priority" not in r:
        return state.add(rid, r["prompt"], r["max_tokens"])
    return state.add(rid, r["prompt"], r["max_tokens"], priority=r["priority"],
                     arrival=0 if plant == "no_arrival" else step)


def _hashes(requests: list[dict], rids: list[int]) -> RequestHashes:
    """The fixture's prompt content, by the kernel's request id ``rids``:
    ``blocks`` are the request's full prompt blocks' chained ids (equal ids,
    equal prefix); without them every block is the request's own."""
    by_rid = [r for _, r in sorted(zip(rids, requests), key=lambda x: x[0])]
    ids = [list(r.get("blocks") or []) for r in by_rid]
    cnt = np.array([len(b) for b in ids], dtype=np.int64)
    off = np.concatenate([[0], np.cumsum(cnt)[:-1]]).astype(np.int64)
    flat = np.array([x for b in ids for x in b], dtype=np.int64)
    return RequestHashes(flat, off, cnt)


def _version(scenario: dict, rules: str | None) -> str:
    """The release whose rules run the scenario: ``rules`` when given (a
    planted swap), else the release that recorded it."""
    return rules or scenario.get("vllm_version") or KERNEL_VERSION


def run_scenario(scenario: dict, num_steps: int, async_rules: bool = False,
                 rules: str | None = None, plant: str | None = None) -> tuple[int, list[dict]]:
    """Free blocks at the start and ``num_steps`` step records, under the
    rules of the release that recorded the scenario (or of ``rules``).

    Requests join the waiting queue (in fixture order) before the
    ``schedule()`` of their arrival step, as in vLLM's engine loop. Their
    output length is ``max_tokens`` (the fixtures use ignore_eos).
    ``async_rules``: the kernel's async mode driven in synchronous order
    (each step's outputs applied before the next plan). ``plant``: a wrong
    priority key, for tests (``_add``, ``_priority_ids``)."""
    requests = scenario["requests"]
    rids = _priority_ids(scenario, plant)
    state = SchedState.new(engine_config(scenario["engine"], async_rules, _version(scenario, rules)),
                           capacity=max(8, len(requests)), hashes=_hashes(requests, rids))
    plan = StepPlan.new(len(state.running))
    name = {}  # latroute's integer request id -> fixture id
    start_free = state.free_blocks
    records = []
    for step in range(1, num_steps + 1):
        for i, r in enumerate(requests):
            if r["arrival_step"] == step:
                _add(state, rids[i], r, step, plant)
                name[rids[i]] = r["id"]
        preemptions = state.req[:, F_PREEMPTIONS].copy()
        n = schedule_step(state, plan)
        slots = plan.slot[:n].copy()
        preempted = sorted(name[int(state.req[s, F_RID])] for s in np.flatnonzero(state.req[:, F_PREEMPTIONS] > preemptions))
        record = {"step": step,
                  "batch": [[name[int(state.req[s, F_RID])], int(t), int(c)]
                            for s, t, c in zip(slots, plan.tokens[:n], plan.computed[:n])],
                  "preempted": preempted,
                  "running": [name[r] for r in state.rids(state.running_slots())],
                  "waiting": [name[r] for r in state.rids(state.waiting_slots())],
                  "free_blocks_scheduled": state.free_blocks}
        complete_step(state, plan, n)
        record["finished"] = [name[int(state.req[s, F_RID])] for s in slots if state.req[s, F_EVENT] & EV_FINISH]
        record["free_blocks"] = state.free_blocks
        records.append(record)
    return start_free, records


BATCH_QUEUE = 2  # vLLM's max_concurrent_batches with async scheduling and no pipeline parallelism


def run_scenario_async(scenario: dict, num_calls: int, rules: str | None = None,
                       plant: str | None = None) -> tuple[int, list[dict]]:
    """The scenario with the kernel in async mode, driven in the order of
    vLLM's ``EngineCore.step_with_batch_queue`` (queue of two): each call
    plans a batch when the scheduler has requests (unfinished, or finished
    since the last plan), returns at once while the queue is not full, else
    applies the oldest batch's outputs. One record per call, in the async
    fixtures' format; the rules and ``plant`` as ``run_scenario``'s."""
    from collections import deque

    requests = scenario["requests"]
    rids = _priority_ids(scenario, plant)
    state = SchedState.new(engine_config(scenario["engine"], True, _version(scenario, rules)),
                           capacity=max(8, len(requests)), hashes=_hashes(requests, rids))
    name: dict[int, str] = {}
    slot_of: dict[int, int] = {}
    queue: deque = deque()
    start_free = state.free_blocks
    finished_since_plan = False
    done: set[int] = set()
    records = []
    for call in range(1, num_calls + 1):
        for i, r in enumerate(requests):
            if r["arrival_step"] == call:
                slot_of[rids[i]] = _add(state, rids[i], r, call, plant)
                name[rids[i]] = r["id"]
        record = {"step": call, "batch": [], "preempted": [], "running": None, "waiting": None,
                  "free_blocks_scheduled": None}
        unfinished = len(state.running_slots()) + len(state.waiting_slots())
        executed = False
        if unfinished > 0 or finished_since_plan:
            plan = StepPlan.new(len(state.running))
            preemptions = state.req[:, F_PREEMPTIONS].copy()
            n = schedule_step(state, plan)
            finished_since_plan = False
            executed = n > 0
            record["batch"] = [[name[int(r)], int(t), int(c), int(state.req[s, F_PH])]
                               for s, r, t, c in zip(plan.slot[:n], plan.rid[:n], plan.tokens[:n], plan.computed[:n])]
            record["preempted"] = sorted(name[int(state.req[s, F_RID])]
                                         for s in np.flatnonzero(state.req[:, F_PREEMPTIONS] > preemptions))
            record["running"] = [name[r] for r in state.rids(state.running_slots())]
            record["waiting"] = [name[r] for r in state.rids(state.waiting_slots())]
            record["free_blocks_scheduled"] = state.free_blocks
            queue.appendleft((call, plan, n))
            unfinished = len(state.running_slots()) + len(state.waiting_slots())
            if len(queue) < BATCH_QUEUE and (executed or unfinished > 0):
                record.update(completed=0, finished=[], free_blocks=state.free_blocks)
                records.append(record)
                continue
        record["completed"] = 0
        if queue:
            record["completed"], plan, n = queue.pop()
            complete_step(state, plan, n)
        now = [i for i in name if i not in done and state.req[slot_of[i], F_RID] == i
               and state.req[slot_of[i], F_STATUS] == ST_FINISHED]
        done.update(now)
        finished_since_plan = finished_since_plan or bool(now)
        record["finished"] = [name[i] for i in sorted(now, key=rids.index)]  # in fixture order, as vLLM's
        record["free_blocks"] = state.free_blocks
        records.append(record)
    return start_free, records
