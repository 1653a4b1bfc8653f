"""SFS as an estimator: Python wrapper around ``sfs_kernel`` holding the
profile's arrays and a scratch copy of the state, sized to the instance."""
from __future__ import annotations

import numpy as np

from estimators.batch_time_kernel import profile_arrays
from estimators.profile import BatchTimeProfile
from estimators.sched_state import NF, NS, S_CAP
from estimators.sfs_kernel import sfs_estimate
from estimators.snapshot import Query, Snapshot

MAX_SIM_STEPS = 1_000_000


class SFS:
    """Serving-framework simulation of one instance (DESIGN section 2)."""

    name = "sfs"

    def __init__(self, profile: BatchTimeProfile, pred_total: np.ndarray, frontend_overhead_s: float = 0.0):
        self.profile = profile
        self.form, self.coef, _, _, _ = profile_arrays(profile)
        self.mult = float(profile.expected_multiplier)
        self.gap = float(profile.step_gap_s)
        self.pred_total = np.ascontiguousarray(pred_total, dtype=np.int64)
        self.overhead = frontend_overhead_s
        self.cap = -1
        self.last_steps = 0
        self.speed = 1.0  # host speed factor (estimators.online_speed): scales every step and gap

    def _scratch(self, cap: int) -> None:
        if cap + 1 > self.cap:
            c = cap + 1
            self.r2 = np.zeros((c, NF), dtype=np.int64)
            self.sc2 = np.zeros(NS, dtype=np.int64)
            self.run2, self.wait2, self.free2 = (np.zeros(c, dtype=np.int64) for _ in range(3))
            self.o_slot, self.o_tok, self.o_cb = (np.zeros(c, dtype=np.int64) for _ in range(3))
            self.rej = np.zeros(c + 1, dtype=np.int64)
            self.cap = c

    def _run(self, st, inbox, n_inbox, slots, tok, cb, n, elapsed, first, rid, prompt) -> float:
        self._scratch(int(st.sc[S_CAP]))
        est, steps = sfs_estimate(st.cfg, st.req, st.sc, st.running, st.waiting, st.free_slots, inbox, n_inbox,
                                  slots, tok, cb, n, elapsed, first, self.pred_total, rid, prompt, self.form,
                                  self.coef, self.mult * self.speed, self.gap * self.speed, self.r2, self.sc2, self.run2, self.wait2,
                                  self.free2, self.o_slot, self.o_tok, self.o_cb, self.rej, MAX_SIM_STEPS)
        self.last_steps = steps
        return est + self.overhead

    def estimate_live(self, inst, t: float, rid: int, prompt: int) -> float:
        """The same estimate straight from a live twin instance (no Snapshot
        object: routers call this once per instance per arrival)."""
        n_inbox, n, elapsed, first = inst.timing(t, self.gap * self.speed)
        return self._run(inst.state, inst.inbox, n_inbox, inst.out_slot, inst.out_tok, inst.out_cb, n, elapsed, first,
                         rid, prompt)

    def estimate(self, snap: Snapshot, q: Query) -> float:
        return self._run(snap.state, snap.inbox, snap.n_inbox, snap.infl_slot, snap.infl_tok, snap.infl_cb,
                         snap.infl_n, snap.elapsed, snap.first_gap(self.gap * self.speed), q.rid, q.prompt)
