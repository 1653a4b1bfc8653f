"""Array layout of one instance's scheduler state.

The scheduler kernel, the engine twin and SFS all work on the same plain
arrays (Numba needs plain arrays; copying them is one memcpy each, which is
what makes an SFS estimate cheap):

- ``req[slot, F_*]`` (int64): one row per resident request (slots are
  recycled through ``free_slots`` when a request finishes);
- ``running[:sc[S_NR]]``: slots in admission order;
- ``waiting``: a circular buffer of slots, head ``sc[S_WHEAD]``, length
  ``sc[S_WN]``; preempted requests are pushed at the front;
- ``sc[S_*]``: scalars (queue lengths, free KV blocks, ...);
- ``cfg[C_*]``: the engine configuration.

This module holds only the layout and its Python-side helpers (creation,
growth, adding requests); the rules live in ``sched_kernel``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# --- per-request fields
F_PROMPT = 0  # prompt tokens P
F_TARGET = 1  # outputs to produce before finishing (true length in the twin, predicted in SFS)
F_COMPUTED = 2  # num_computed_tokens (advanced at schedule time, as vLLM does)
F_OUTPUTS = 3  # outputs produced so far O; num_tokens = P + O
F_BLOCKS = 4  # KV blocks held
F_STATUS = 5
F_RID = 6  # request id
F_HIT = 7  # prefix-cache hit tokens available at admission (block aligned)
F_PREEMPTIONS = 8
F_EVENT = 9  # set by complete_step: bit 1 = first token this step, bit 2 = finished this step
NF = 10

# statuses
ST_FREE, ST_WAITING, ST_RUNNING, ST_FINISHED, ST_PENDING, ST_REJECTED = 0, 1, 2, 3, 4, 5
EV_FIRST, EV_FINISH = 1, 2

# --- scalars
S_NR = 0  # running count
S_WHEAD = 1  # waiting head index
S_WN = 2  # waiting count
S_FREE_BLOCKS = 3  # usable free KV blocks
S_NFREE_SLOTS = 4
S_NPREEMPT = 5  # preemptions in the last scheduled step
S_CAP = 6  # rows of req
S_STEP = 7  # steps scheduled so far
NS = 8

# --- configuration
C_POLICY = 0
C_BUDGET = 1  # max_num_batched_tokens (Sarathi: chunk size)
C_MAX_SEQS = 2
C_BLOCK = 3
C_NUM_BLOCKS = 4  # as configured; one is vLLM's null block
C_LONG_PREFILL = 5  # long_prefill_token_threshold, 0 = off
C_CHUNKED = 6
C_MAX_LEN = 7  # max_model_len
C_WATERMARK = 8  # blocks kept free at admission (Sarathi and V0: 1%)
NC = 9

POLICIES = {"vllm-v1": 0, "sarathi": 1, "vllm-v0": 2}


@dataclass(frozen=True)
class EngineConfig:
    """What the scheduler needs to know about an instance."""

    policy: str = "vllm-v1"
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 128
    block_size: int = 16
    num_kv_blocks: int = 10_000
    long_prefill_token_threshold: int = 0
    chunked_prefill: bool = True
    max_model_len: int = 32768
    watermark: float | None = None  # fraction of blocks; None = the policy's default

    def to_array(self) -> np.ndarray:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r} (choose from {', '.join(POLICIES)})")
        chunked = self.chunked_prefill and self.policy != "vllm-v0"
        if not chunked and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                             f">= max_model_len ({self.max_model_len}), as vLLM requires")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs, as vLLM requires")
        wm = self.watermark if self.watermark is not None else (0.0 if self.policy == "vllm-v1" else 0.01)
        cfg = np.zeros(NC, dtype=np.int64)
        cfg[C_POLICY] = POLICIES[self.policy]
        cfg[C_BUDGET] = self.max_num_batched_tokens
        cfg[C_MAX_SEQS] = self.max_num_seqs
        cfg[C_BLOCK] = self.block_size
        cfg[C_NUM_BLOCKS] = self.num_kv_blocks
        cfg[C_LONG_PREFILL] = self.long_prefill_token_threshold
        cfg[C_CHUNKED] = 1 if chunked else 0
        cfg[C_MAX_LEN] = self.max_model_len
        cfg[C_WATERMARK] = int(wm * self.num_kv_blocks)
        return cfg


@dataclass
class SchedState:
    """One instance's scheduler state (plain arrays, see module doc)."""

    cfg: np.ndarray
    req: np.ndarray
    sc: np.ndarray
    running: np.ndarray
    waiting: np.ndarray
    free_slots: np.ndarray

    @classmethod
    def new(cls, engine: EngineConfig, capacity: int = 64) -> SchedState:
        cfg = engine.to_array()
        sc = np.zeros(NS, dtype=np.int64)
        sc[S_FREE_BLOCKS] = cfg[C_NUM_BLOCKS] - 1  # vLLM's block pool keeps one null block
        sc[S_CAP] = capacity
        sc[S_NFREE_SLOTS] = capacity
        return cls(cfg, np.zeros((capacity, NF), dtype=np.int64), sc, np.zeros(capacity, dtype=np.int64),
                   np.zeros(capacity, dtype=np.int64), np.arange(capacity - 1, -1, -1, dtype=np.int64))

    def copy(self) -> SchedState:
        return SchedState(self.cfg, self.req.copy(), self.sc.copy(), self.running.copy(), self.waiting.copy(),
                          self.free_slots.copy())

    def grow(self, capacity: int) -> None:
        """Enlarge every per-slot array to ``capacity`` rows (keeps order)."""
        old = int(self.sc[S_CAP])
        if capacity <= old:
            return
        req = np.zeros((capacity, NF), dtype=np.int64)
        req[:old] = self.req
        running = np.zeros(capacity, dtype=np.int64)
        running[:old] = self.running
        wn, head = int(self.sc[S_WN]), int(self.sc[S_WHEAD])
        waiting = np.zeros(capacity, dtype=np.int64)
        waiting[:wn] = self.waiting[(head + np.arange(wn)) % old]
        nfree = int(self.sc[S_NFREE_SLOTS])
        free = np.zeros(capacity, dtype=np.int64)
        new_slots = np.arange(capacity - 1, old - 1, -1, dtype=np.int64)
        free[: new_slots.size] = new_slots
        free[new_slots.size: new_slots.size + nfree] = self.free_slots[:nfree]
        self.req, self.running, self.waiting, self.free_slots = req, running, waiting, free
        self.sc[S_WHEAD] = 0
        self.sc[S_NFREE_SLOTS] = nfree + new_slots.size
        self.sc[S_CAP] = capacity

    def add(self, rid: int, prompt: int, target: int, hit: int = 0, computed: int = 0, outputs: int = 0,
            status: int = ST_WAITING) -> int:
        """Put a request in a free slot and, if WAITING, at the back of the
        waiting queue. Returns its slot."""
        if self.sc[S_NFREE_SLOTS] == 0:
            self.grow(2 * int(self.sc[S_CAP]))
        self.sc[S_NFREE_SLOTS] -= 1
        slot = int(self.free_slots[self.sc[S_NFREE_SLOTS]])
        row = self.req[slot]
        row[:] = 0
        row[F_PROMPT], row[F_TARGET], row[F_RID], row[F_HIT] = prompt, max(1, target), rid, hit
        row[F_COMPUTED], row[F_OUTPUTS], row[F_STATUS] = computed, outputs, status
        if status == ST_WAITING:
            cap = int(self.sc[S_CAP])
            self.waiting[(self.sc[S_WHEAD] + self.sc[S_WN]) % cap] = slot
            self.sc[S_WN] += 1
        return slot

    # --- read-only views (tests, validation, routers)
    def running_slots(self) -> np.ndarray:
        return self.running[: self.sc[S_NR]].copy()

    def waiting_slots(self) -> np.ndarray:
        cap, head, wn = int(self.sc[S_CAP]), int(self.sc[S_WHEAD]), int(self.sc[S_WN])
        return self.waiting[(head + np.arange(wn)) % cap]

    def rids(self, slots: np.ndarray) -> list[int]:
        return [int(self.req[s, F_RID]) for s in slots]

    @property
    def free_blocks(self) -> int:
        return int(self.sc[S_FREE_BLOCKS])
