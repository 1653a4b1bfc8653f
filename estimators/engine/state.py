"""One instance's scheduler state, as named bundles of plain arrays.

Numba needs plain arrays; a ``NamedTuple`` of them is one argument that
Numba types as a whole, so kernels take a handful of bundles instead of
long positional lists where a swap would be a silent wrong answer.
Copying a state is one memcpy per array, which is what makes an SFS
estimate cheap.

``SchedState`` (what the scheduler works on):

- ``req[slot, F_*]`` (int64): one row per resident request (slots are
  recycled through ``free_slots`` when a request finishes);
- ``running[:sc[S_NR]]``: slots in admission order;
- ``waiting``: a circular buffer of slots, head ``sc[S_WHEAD]``, length
  ``sc[S_WN]``; preempted requests are pushed at the front (the moves are
  in ``primitives``, written once); under priority scheduling it is kept
  sorted by (``F_PRIO``, ``F_ARRIVAL``, ``F_RID``), preempted requests
  included;
- ``sc[S_*]``: scalars (queue lengths, free KV blocks, ...);
- ``cfg[C_*]``: the engine configuration (``InstanceConfig.to_array``).

Per-instance arrays of new engine features are further fields of
``SchedState``: ``new``, ``copy`` and ``grown`` are the only places that
build one. Prefix caching (``block_pool``) adds ``table`` (each
slot's KV block ids, no columns when caching is off), ``bc`` (vLLM's block
pool: ref counts, hash map, free queue), ``hashes`` (every request's block
ids, shared) and ``ov`` (SFS's overlay over a live cache it does not copy).

``StepPlan`` (what one schedule() chose): the batch (``slot``, ``tokens``,
``computed`` before the step, in scheduler order), the slots preempted
while scheduling it (``preempted``, in preemption order, count in
``sc[S_NPREEMPT]``) and the slots refused outright (``rejected``), with
the counts in ``counts[PL_*]``.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from estimators.engine.block_ids import RequestHashes, ids_of, no_request_hashes
from estimators.engine.block_overlay import Overlay, new_overlay
from estimators.engine.block_pool import B_FREE_ALL_TO_TAIL, BlockCache, copy_block_cache, find_hit, new_block_cache
from estimators.engine.config import POLICIES, InstanceConfig
from estimators.engine.layout import (
    C_BLOCK,
    C_MAX_LEN,
    C_NUM_BLOCKS,
    C_POLICY,
    C_PREFIX,
    C_RULES,
    C_SCHED_PRIORITY,
    F_ARRIVAL,
    F_COMPUTED,
    F_HIT,
    F_OUTPUTS,
    F_PRIO,
    F_PROMPT,
    F_RID,
    F_STATUS,
    F_TARGET,
    NF,
    NF_ASYNC,
    NF_PRIORITY,
    NPL,
    NS,
    PREFIX_ON,
    S_CAP,
    S_FREE_BLOCKS,
    S_NFREE_SLOTS,
    S_NR,
    S_WHEAD,
    S_WN,
    ST_WAITING,
    KernelInputError,
)
from estimators.engine.primitives import wait_enqueue, wait_linear
from estimators.engine.releases import R_FREE_ALL_TO_TAIL

POLICY_V0 = POLICIES["vllm-v0"]  # it refuses over-long prompts in its own scheduler


class StepPlan(NamedTuple):
    """One schedule()'s decisions (see module doc)."""

    slot: np.ndarray
    tokens: np.ndarray
    computed: np.ndarray  # num_computed_tokens before the step
    preempted: np.ndarray
    rejected: np.ndarray
    counts: np.ndarray
    rid: np.ndarray  # async scheduling: the request each item was for (its slot may be reused before the outputs)
    samples: np.ndarray  # async scheduling: 1 if the item samples a token (not a prefill chunk)
    preemptions: np.ndarray  # async scheduling: the request's preemptions then (more by the outputs: stale)

    @classmethod
    def new(cls, capacity: int) -> StepPlan:
        z = lambda: np.zeros(capacity, dtype=np.int64)  # noqa: E731
        return cls(z(), z(), z(), z(), z(), np.zeros(NPL, dtype=np.int64), z(), z(), z())

    def grown(self, capacity: int) -> StepPlan:
        """A larger plan with the same contents (a step in flight keeps its
        batch, preemptions and refusals)."""
        new = StepPlan.new(capacity)
        for a, b in zip(new, self):
            a[: b.size] = b
        return new


class SchedCore(NamedTuple):
    """The scheduler arrays of a ``SchedState`` without its prefix-cache
    fields: what SFS copies from (a compiled call unboxes every array it is
    handed, so SFS is not handed the cache it does not copy)."""

    cfg: np.ndarray
    req: np.ndarray
    sc: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    free_slots: np.ndarray


class SchedState(NamedTuple):
    """One instance's scheduler state (see module doc)."""

    cfg: np.ndarray
    req: np.ndarray
    sc: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    free_slots: np.ndarray
    table: np.ndarray  # prefix caching: int64[slot, block] block table (no columns when caching is off)
    bc: BlockCache  # prefix caching: the block pool and its cache (a 2-block stub when off)
    hashes: RequestHashes  # every request's full-block ids (shared, read only)
    ov: Overlay  # SFS: ids registered during a simulation over a live cache it does not copy

    @classmethod
    def new(cls, engine: InstanceConfig, capacity: int = 64, hashes: RequestHashes | None = None) -> SchedState:
        cfg = engine.to_array()
        sc = np.zeros(NS, dtype=np.int64)
        sc[S_FREE_BLOCKS] = cfg[C_NUM_BLOCKS] - 1  # vLLM's block pool keeps one null block
        sc[S_CAP] = capacity
        sc[S_NFREE_SLOTS] = capacity
        if engine.caching:
            bc = new_block_cache(engine.num_kv_blocks)
            bc.sc[B_FREE_ALL_TO_TAIL] = 1 if cfg[C_RULES] & R_FREE_ALL_TO_TAIL else 0
            table = np.zeros((capacity, -(-engine.max_model_len // engine.block_size) + 1), dtype=np.int64)
        else:
            bc, table = new_block_cache(2), np.zeros((capacity, 0), dtype=np.int64)
        # F_PH exists only where async rules touch it, F_PRIO and F_ARRIVAL only where priority rules read them
        width = NF_PRIORITY if cfg[C_SCHED_PRIORITY] else NF_ASYNC if engine.async_scheduling else NF
        return cls(cfg, np.zeros((capacity, width), dtype=np.int64), sc, np.zeros(capacity, dtype=np.int64),
                   np.zeros(capacity, dtype=np.int64), np.arange(capacity - 1, -1, -1, dtype=np.int64), table, bc,
                   hashes if hashes is not None else no_request_hashes(), new_overlay(0, 2))

    def copy(self) -> SchedState:
        return SchedState(self.cfg, self.req.copy(), self.sc.copy(), self.running.copy(), self.waiting.copy(),
                          self.free_slots.copy(), self.table.copy(), copy_block_cache(self.bc), self.hashes,
                          self.ov)

    def core(self) -> SchedCore:
        return SchedCore(self.cfg, self.req, self.sc, self.running, self.waiting, self.free_slots)

    def with_hashes(self, hashes: RequestHashes) -> SchedState:
        return self._replace(hashes=hashes)

    def cached_prefix_tokens(self, rid: int, num_tokens: int) -> int:
        """Tokens of request ``rid``'s longest cached prefix on this instance
        now (vLLM's lookup, read only; 0 with caching off)."""
        if self.cfg[C_PREFIX] != PREFIX_ON:
            return 0
        off, n = ids_of(self.hashes, rid)
        b = int(self.cfg[C_BLOCK])
        return int(find_hit(self.bc, self.hashes.flat, off, n, rid, num_tokens, b)) * b

    def kv_usage(self) -> float:
        """vLLM's ``kv_cache_usage``: 1 - free / usable (evictable cached blocks are free)."""
        return 1.0 - float(self.sc[S_FREE_BLOCKS]) / max(1, int(self.cfg[C_NUM_BLOCKS]) - 1)

    @property
    def capacity(self) -> int:
        return int(self.sc[S_CAP])

    def grown(self, capacity: int) -> SchedState:
        """The same state with every per-slot array enlarged to ``capacity``
        rows (order kept; the waiting queue is linearised)."""
        old = self.capacity
        if capacity <= old:
            return self
        req = np.zeros((capacity, self.req.shape[1]), dtype=np.int64)
        req[:old] = self.req
        running = np.zeros(capacity, dtype=np.int64)
        running[:old] = self.running
        waiting = np.zeros(capacity, dtype=np.int64)
        wait_linear(self.sc, self.waiting, waiting)
        nfree = int(self.sc[S_NFREE_SLOTS])
        free = np.zeros(capacity, dtype=np.int64)
        new_slots = np.arange(capacity - 1, old - 1, -1, dtype=np.int64)
        free[: new_slots.size] = new_slots
        free[new_slots.size: new_slots.size + nfree] = self.free_slots[:nfree]
        sc = self.sc.copy()
        sc[S_WHEAD] = 0
        sc[S_NFREE_SLOTS] = nfree + new_slots.size
        sc[S_CAP] = capacity
        table = np.zeros((capacity, self.table.shape[1]), dtype=np.int64)
        table[:old] = self.table
        return SchedState(self.cfg, req, sc, running, waiting, free, table, self.bc, self.hashes, self.ov)

    def with_room(self) -> SchedState:
        """This state if it has a free slot, else one twice as large."""
        return self if self.sc[S_NFREE_SLOTS] > 0 else self.grown(2 * self.capacity)

    def add(self, rid: int, prompt: int, target: int, hit: int = 0, computed: int = 0, outputs: int = 0,
            status: int = ST_WAITING, priority: int = 0, arrival: int | None = None) -> int:
        """Put a request in a free slot and, if WAITING, at the back of the
        waiting queue (priority scheduling: at its place by ``priority``,
        lower first, then ``arrival``, an integer arrival time, equal for
        requests that arrived together, default ``rid``, then ``rid``).
        Returns its slot (``with_room`` first if it may be full). A priority
        other than 0 needs an instance under priority scheduling."""
        self.check_prompt(rid, prompt)
        ordered = self.cfg[C_SCHED_PRIORITY] != 0
        if priority != 0 and not ordered:
            raise ValueError(f"request {rid}: priority {priority} on an instance whose scheduling_policy is fcfs")
        self.sc[S_NFREE_SLOTS] -= 1
        slot = int(self.free_slots[self.sc[S_NFREE_SLOTS]])
        row = self.req[slot]
        row[:] = 0
        row[F_PROMPT], row[F_TARGET], row[F_RID], row[F_HIT] = prompt, max(1, target), rid, hit
        row[F_COMPUTED], row[F_OUTPUTS], row[F_STATUS] = computed, outputs, status
        if ordered:
            row[F_PRIO], row[F_ARRIVAL] = priority, rid if arrival is None else arrival
        if status == ST_WAITING:
            wait_enqueue(self.cfg, self.req, self.sc, self.waiting, slot)
        return slot

    def check_prompt(self, rid: int, prompt: int) -> None:
        """Refuse a request ``add`` cannot take: no free slot, or a prompt
        that cannot reach the scheduler."""
        if self.sc[S_NFREE_SLOTS] == 0:
            raise ValueError("no free slot: call with_room() first")
        if prompt < 0 or (prompt >= self.cfg[C_MAX_LEN] and self.cfg[C_PREFIX] == PREFIX_ON
                          and self.cfg[C_POLICY] != POLICY_V0):
            # the engine's front end refuses such a prompt (V0's scheduler refuses it itself); admitted with
            # prefix caching it would take more blocks than a block table holds (a write past the table)
            raise KernelInputError(f"request {rid}: a prompt of {prompt} tokens outside [0, max_model_len "
                                   f"{int(self.cfg[C_MAX_LEN])}) cannot reach the scheduler")

    # --- read-only views (tests, validation, routers)
    def running_slots(self) -> np.ndarray:
        return self.running[: self.sc[S_NR]].copy()

    def waiting_slots(self) -> np.ndarray:
        out = np.zeros(int(self.sc[S_WN]), dtype=np.int64)
        wait_linear(self.sc, self.waiting, out)
        return out

    def rids(self, slots: np.ndarray) -> list[int]:
        return [int(self.req[s, F_RID]) for s in slots]

    def progress(self, slots: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per slot: request id, prompt tokens, tokens computed and outputs
        produced (what a router may read of residents without the ``F_*``
        layout)."""
        r = self.req[slots]
        return r[:, F_RID], r[:, F_PROMPT], r[:, F_COMPUTED], r[:, F_OUTPUTS]

    @property
    def free_blocks(self) -> int:
        return int(self.sc[S_FREE_BLOCKS])
