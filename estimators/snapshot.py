"""Honest snapshots of an instance at a query's arrival.

What an observer (router, estimator) may know at time t: the state after
every step that ended at or before t; the in-flight step's start and
composition, not its end; the requests that arrived at the instance but
have not been handed to the scheduler yet (they join at the next step
boundary, in arrival order); and true output lengths of nobody (each
estimator brings its own prediction).

``RecordedWalk`` rebuilds such snapshots from a trace's ``steps`` and
``step_items`` (recorded or simulated) by applying the recorded batches in
order; the twin hands routers views of its live state the same way
(``harness.twin.views.honest``).

The walk must know each request's true output length (a request finishes
when it has produced them), yet the snapshots it hands out share its
state, and code that walks a snapshot's arrays would read whatever they
hold. So the truth is in the state only while a recorded step completes
(``complete_revealing``): at rest every resident's ``F_TARGET`` is the
predicted length the estimators were given (``predicted``), or 1.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from numba import njit

from estimators.engine.config import InstanceConfig
from estimators.engine.kernel import complete_step, drop_unservable_head, schedule_step
from estimators.engine.layout import (
    F_RID,
    F_STATUS,
    F_TARGET,
    PL_N,
    S_NR,
    S_WN,
    ST_PENDING,
    ST_WAITING,
    KernelInputError,
)
from estimators.engine.primitives import release_slot, wait_push_back
from estimators.engine.recorded import apply_batch
from estimators.engine.state import SchedState, StepPlan
from estimators.engine.view import Query, first_gap  # noqa: F401  (re-exported: estimators import Query here)
from estimators.trace_blocks import request_hashes, trace_refusal
from traces.errors import BadInput
from traces.steplog import StepLog
from traces.store import Trace


@dataclass
class Snapshot:
    """One instance at time ``t`` (an ``InstanceView``; arrays are live:
    estimators copy them)."""

    t: float
    instance_id: str
    state: SchedState
    inbox: np.ndarray  # slots arrived but not yet joined, in arrival order
    n_inbox: int
    inflight: StepPlan  # the in-flight step (first infl_n items)
    infl_n: int
    infl_start: float | None  # None when no step is in flight
    arrival_rate: float = 0.0  # EWMA of arrivals to this instance, per second
    wake_s: float | None = None  # between steps: when the engine's last boundary (or wake-up) was

    def first_gap(self, gap: float) -> float:
        return first_gap(self.t, self.infl_start, self.wake_s, gap)

    @property
    def elapsed(self) -> float:
        """Time since the in-flight step started (0 when idle; negative if it
        has been scheduled but waits out the inter-step gap)."""
        return 0.0 if self.infl_start is None else self.t - self.infl_start

    @property
    def residents(self) -> int:
        return int(self.state.sc[S_NR] + self.state.sc[S_WN]) + self.n_inbox

    @property
    def queued(self) -> int:
        return int(self.state.sc[S_WN]) + self.n_inbox

    def resident_slots(self) -> np.ndarray:
        st = self.state
        return np.concatenate([st.running_slots(), st.waiting_slots(), self.inbox[: self.n_inbox]])

    def resident_progress(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.state.progress(self.resident_slots())


class RateTracker:
    """Exponentially decayed arrival count: rate(t) = sum_j exp(-(t - t_j)/tau) / tau."""

    def __init__(self, tau_s: float = 10.0):
        self.tau = tau_s
        self.level = 0.0
        self.last = None

    def rate(self, t: float) -> float:
        if self.last is None:
            return 0.0
        return self.level * np.exp(-(t - self.last) / self.tau) / self.tau

    def observe(self, t: float) -> None:
        self.level = (self.level * np.exp(-(t - self.last) / self.tau) if self.last is not None else 0.0) + 1.0
        self.last = t


@njit(cache=True)
def complete_revealing(st, plan, n, true_target, rest_target):
    """``complete_step`` with the batch's true targets in the state for
    that call only (the module docstring says why); rows are keyed by
    ``F_RID``, the request's position in the trace."""
    req = st.req
    for j in range(n):
        s = plan.slot[j]
        req[s, F_TARGET] = true_target[req[s, F_RID]]
    done = complete_step(st, plan, n)
    for j in range(n):
        s = plan.slot[j]
        req[s, F_TARGET] = rest_target[req[s, F_RID]]
    return done


class RecordedWalk:
    """Replays one instance's recorded steps, yielding pre-step states and
    honest snapshots. Request keys (``F_RID``) are row positions in the
    trace's ``requests`` table."""

    def __init__(self, trace: Trace, instance_id: str, requests: pd.DataFrame | None = None,
                 caching: bool | None = None, predicted: np.ndarray | None = None):
        """``caching``: override the instance's prefix caching (False: a
        cache-blind observer, whose state follows the recorded batches but
        who knows no cache contents). ``predicted``: the output lengths the
        observers were told (per trace row), what the snapshots show as
        targets (1 without)."""
        reqs = trace.read("requests") if requests is None else requests
        self.trace = trace
        self.instance_id = instance_id
        self.engine = InstanceConfig.from_table(trace.read("instances"), instance_id)
        if caching is not None:
            self.engine = replace(self.engine, prefix_caching=caching)
        mine = np.flatnonzero((reqs["instance_id"] == instance_id).to_numpy()) if "instance_id" in reqs \
            else np.arange(len(reqs))
        arrival = reqs["arrival_s"].to_numpy(dtype=np.float64)
        join = reqs["added_s"].to_numpy(dtype=np.float64) if "added_s" in reqs else arrival
        order = mine[np.lexsort((mine, arrival[mine]))]
        self.order = order  # this instance's requests by arrival
        self.arrival, self.join = arrival, np.where(np.isnan(join), arrival, join)
        self.prompt = reqs["prompt_tokens"].to_numpy(dtype=np.int64)
        self.output = np.maximum(reqs["output_tokens"].to_numpy(dtype=np.int64), 1)
        self.rest = (np.ones(len(reqs), dtype=np.int64) if predicted is None
                     else np.maximum(np.asarray(predicted, dtype=np.int64), 1))  # targets at rest (see module doc)
        pos = pd.Series(np.arange(len(reqs)), index=reqs["request_id"].to_numpy())

        log = StepLog.read(trace, instance_id)
        steps = log.steps
        self.steps = steps
        self.step_ids = steps["step"].to_numpy()
        self.start = steps["start_s"].to_numpy(dtype=np.float64)
        self.end = steps["end_s"].to_numpy(dtype=np.float64)
        items = log.step_items
        _known(trace, "step_items", items, "step", self.step_ids, "names a step the steps table lacks")
        _known(trace, "step_items", items, "request_id", reqs["request_id"].to_numpy(),
               "names a request the requests table lacks")
        kpos = pd.Series(np.arange(len(steps)), index=self.step_ids)
        ik = kpos.loc[items["step"].to_numpy()].to_numpy()
        srt = np.argsort(ik, kind="stable")
        self.item_req = pos.loc[items["request_id"].to_numpy()].to_numpy()[srt]
        self.item_tok = items["tokens"].to_numpy(dtype=np.int64)[srt]
        self.item_cb = items["computed_before"].to_numpy(dtype=np.int64)[srt]
        self.item_off = np.searchsorted(ik[srt], np.arange(len(steps) + 1))
        pre = log.preemptions
        if len(pre):
            _known(trace, "preemptions", pre, "step", self.step_ids,
                   "names a step the steps table lacks")
            _known(trace, "preemptions", pre, "request_id", reqs["request_id"].to_numpy(),
                   "names a request the requests table lacks")
            pk = kpos.loc[pre["step"].to_numpy()].to_numpy()
            ps = np.argsort(pk, kind="stable")
            self.pre_req = pos.loc[pre["request_id"].to_numpy()].to_numpy()[ps]
            self.pre_off = np.searchsorted(pk[ps], np.arange(len(steps) + 1))
        else:
            self.pre_req = np.zeros(0, dtype=np.int64)
            self.pre_off = np.zeros(len(steps) + 1, dtype=np.int64)

        # prefix caching: the cache's contents are rebuilt by applying its rules along the recorded batches
        with self.refusing():
            hashes = request_hashes(reqs["hash_ids"].tolist() if "hash_ids" in reqs else None, self.prompt,
                                    trace.meta.get("hash_block_tokens"), self.engine.block_size)
        self.state = SchedState.new(self.engine, capacity=len(order) + 2, hashes=hashes)
        cap = self.state.capacity
        self.plan = StepPlan.new(cap)  # the recorded batch being applied (or in flight)
        self.trial_plan = StepPlan.new(cap)
        self.slot_of = np.full(len(reqs), -1, dtype=np.int64)
        self.inbox = np.zeros(cap, dtype=np.int64)
        self.inbox_req: list[int] = []
        self.next_arrival = 0  # position in self.order
        self.k = 0  # next step to complete
        self.applied = False  # step k's scheduling already applied

    @contextmanager
    def refusing(self, step: int | None = None):
        """A kernel's refusal of what the trace fed it, as the trace's
        one-line refusal: the kernels check their inputs (never index past
        an array), and the file they came from is named here."""
        try:
            yield
        except KernelInputError as e:
            if step is None and self.k < len(getattr(self, "step_ids", ())):
                step = int(self.step_ids[self.k])
            raise trace_refusal(self.trace, e, self.instance_id, step) from None

    # --- moving the state forward
    def arrive_until(self, t: float, before_pos: int | None = None) -> None:
        """Requests arriving at or before ``t`` (and, if given, before
        position ``before_pos`` in arrival order) reach the instance."""
        limit = len(self.order) if before_pos is None else before_pos
        while self.next_arrival < limit and self.arrival[self.order[self.next_arrival]] <= t:
            idx = int(self.order[self.next_arrival])
            self.next_arrival += 1
            if self.prompt[idx] >= self.engine.max_model_len:
                continue  # refused by the engine's front end: it never reaches the scheduler
            self.slot_of[idx] = self.state.add(idx, int(self.prompt[idx]), int(self.rest[idx]), status=ST_PENDING)
            self.inbox_req.append(idx)

    def join_until(self, t: float) -> None:
        """Arrived requests handed to the scheduler by the boundary at ``t``."""
        keep = []
        for idx in self.inbox_req:
            if self.join[idx] <= t:
                s = int(self.slot_of[idx])
                self.state.req[s, F_STATUS] = ST_WAITING
                wait_push_back(self.state.sc, self.state.waiting, s)
            else:
                keep.append(idx)
        self.inbox_req = keep

    def prepare(self, k: int) -> None:
        """Bring the state to just before step k's schedule()."""
        self.arrive_until(self.start[k])
        self.join_until(self.start[k])
        self.drop_unservable()

    def drop_unservable(self) -> None:
        """With nothing running, a head of ``waiting`` that the kernel still
        cannot schedule could never run: the engine (the twin, as SFS does)
        refused it, so it leaves the state here too."""
        st = self.state
        while st.sc[S_NR] == 0 and st.sc[S_WN] > 0:
            if schedule_step(st.copy(), self.trial_plan) > 0:
                return
            release_slot(st, drop_unservable_head(st))

    def batch(self, k: int) -> int:
        """Load step k's recorded batch and preemptions into ``self.plan``;
        returns the batch size."""
        a, b = self.item_off[k], self.item_off[k + 1]
        n = b - a
        self.plan.slot[:n] = self.slot_of[self.item_req[a:b]]
        self.plan.tokens[:n] = self.item_tok[a:b]
        self.plan.computed[:n] = self.item_cb[a:b]
        self.plan.counts[PL_N] = n
        return n

    def preempted(self, k: int) -> int:
        a, b = self.pre_off[k], self.pre_off[k + 1]
        self.plan.preempted[: b - a] = self.slot_of[self.pre_req[a:b]]
        return b - a

    def apply(self, k: int) -> None:
        n = self.batch(k)
        apply_batch(self.state, self.plan, n, self.preempted(k))

    def complete(self, k: int) -> None:
        complete_revealing(self.state, self.plan, self.batch(k), self.output, self.rest)

    def step_through(self, k: int) -> None:
        with self.refusing(int(self.step_ids[k])):
            if not self.applied:
                self.prepare(k)
                self.apply(k)
            self.complete(k)
        self.applied = False

    # --- snapshots
    def snapshot(self, pos: int) -> Snapshot:
        """The instance as seen when the request at arrival position ``pos``
        arrives (that request itself not included)."""
        idx = int(self.order[pos])
        t = float(self.arrival[idx])
        while self.k < len(self.end) and self.end[self.k] <= t:
            self.step_through(self.k)
            self.k += 1
        infl_start = None
        wake = None
        n = 0
        with self.refusing():
            if self.k < len(self.start) and self.start[self.k] <= t:
                if not self.applied:
                    self.prepare(self.k)
                    self.apply(self.k)
                    self.applied = True
                n = self.batch(self.k)
                infl_start = float(self.start[self.k])
            self.arrive_until(t, before_pos=pos)
        n_in = len(self.inbox_req)
        self.inbox[:n_in] = self.slot_of[self.inbox_req]
        if infl_start is None:
            # between steps: the engine schedules a gap after its last boundary if
            # it had work then, else a gap after the first arrival that woke it
            last_end = self.end[self.k - 1] if self.k > 0 else -np.inf
            st = self.state
            if st.sc[S_NR] + st.sc[S_WN] > 0 or any(self.arrival[i] <= last_end for i in self.inbox_req):
                wake = float(last_end)
            elif self.inbox_req:
                wake = float(self.arrival[self.inbox_req[0]])
        return Snapshot(t, self.instance_id, self.state, self.inbox, n_in, self.plan, n, infl_start, 0.0, wake)

    def queries(self) -> Iterator[tuple[int, Snapshot]]:
        """(request index, snapshot) for every request, in arrival order."""
        for pos in range(len(self.order)):
            yield int(self.order[pos]), self.snapshot(pos)


def _known(trace: Trace, table: str, frame: pd.DataFrame, column: str, known: np.ndarray, reason: str) -> None:
    """Every key of ``frame[column]`` among ``known``, or the first that is not, refused with its row in the
    table's file (the frame keeps the file's row index): a lookup by a missing key would fail deep inside the
    walk with no file to name."""
    values = frame[column].to_numpy()
    bad = np.flatnonzero(~np.isin(values, known))
    if len(bad):
        path = trace.file(table) if hasattr(trace, "file") else table
        row = frame.index[bad[0]]
        raise BadInput(path, int(row) + 1 if isinstance(row, (int, np.integer)) else None, column,
                       f"{values[bad[0]]!r} {reason}")
