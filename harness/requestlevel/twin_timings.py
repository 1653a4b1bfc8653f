"""The twin's replay reduced to what a fit scores: each request's first-token and finish times,
and (for the front end's deliveries) each step's end and decode tokens.

Why: a request-level fit replays its traces hundreds of times and reads three numbers per
request from each replay. The twin's full result is tables (the requests with every column, the
instances, and with deliveries the step log's three tables); building them took longer than the
simulation itself in a fleet fit with the measured front end (about 45% of its time, against
about 20% in the twin's own loop). ``TimingTwin`` is the same twin, run the same way, whose
result is those arrays only, computed as ``Twin._result`` and ``StepLog.from_items`` compute
them (the same floats: ``tests/test_request_fleet.py`` compares them).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.twin.simulation import Twin
from traces.datamodel.step_aggregates import item_terms


@dataclass
class Timings:
    """A replay's timings, in the order of the requests it was given (warm-up rows included)."""

    requests: dict[str, np.ndarray]  # ttft_s (with the twin's front-end overhead), finish_s
    steps: dict[str, np.ndarray] | None  # end_s, decode_tokens per step, instance after instance (None: not recorded)


class TimingTwin(Twin):
    """``Twin`` whose ``run`` returns ``Timings`` instead of a ``TwinResult``."""

    def _result(self, requests: pd.DataFrame, ev, insts: list) -> Timings:
        arrival = requests["arrival_s"].to_numpy(dtype=np.float64)
        o = ev.out
        reqs = {"ttft_s": o.first_t - arrival + (self.cfg.frontend_overhead_s or 0.0), "finish_s": o.finish_t}
        if not self.cfg.record_steps:
            return Timings(reqs, None)
        ends, decodes = [], []
        for inst in insts:  # as Instance.step_log and StepLog.from_items read the flushed log
            if not inst.log_parts:
                continue
            t, cnt, items = (np.concatenate([part[i] for part in inst.log_parts]) for i in range(3))
            item_step = np.repeat(np.arange(len(cnt), dtype=np.int64), cnt)
            is_decode = item_terms(items[:, 1], items[:, 2], items[:, 3])["decode_tokens"] > 0
            ends.append(np.asarray(t[:, 1], dtype=np.float64))
            decodes.append(np.bincount(item_step[is_decode], minlength=len(cnt)).astype(np.int64))
        if not ends:
            return Timings(reqs, {"end_s": np.zeros(0), "decode_tokens": np.zeros(0, dtype=np.int64)})
        return Timings(reqs, {"end_s": np.concatenate(ends), "decode_tokens": np.concatenate(decodes)})
