"""SFS cost benchmark (``latroute bench --only sfs``).

States are built like a busy qwen3-8b H100 instance: N residents decoding
(prompt and output lengths from the paper's workload, part of each output
already produced), a short queue of new prompts behind them, and a decode
step in flight. Each estimate is timed through the estimator's Python entry
point, as routers call it; the first call (compile or cache load) is timed
apart.
"""
from __future__ import annotations

import time

import numpy as np

from estimators.engine.config import InstanceConfig
from estimators.engine.layout import F_BLOCKS, S_FREE_BLOCKS, S_NR, ST_RUNNING
from estimators.engine.primitives import cdiv
from estimators.engine.state import SchedState, StepPlan
from estimators.sfs.estimator import SFS
from estimators.snapshot import Query, Snapshot
from estimators.timemodel.profile import load_profile
from traces.workload.generator import WorkloadConfig, generate_workload

# prefix caching off, as in pool qwen3-h100: the states below hold blocks as counts
# (the warm-cache case is ``bench_sfs_cache``)
ENGINE = InstanceConfig(instance_id="bench", max_num_batched_tokens=32768, max_num_seqs=2048, block_size=16,
                        num_kv_blocks=400_000, max_model_len=40960, prefix_caching=False)


def busy_state(n_residents: int, n_waiting: int, rng: np.random.Generator, lengths) -> tuple[Snapshot, np.ndarray]:
    prompts, outputs = lengths
    st = SchedState.new(ENGINE, capacity=n_residents + n_waiting + 2)
    total = n_residents + n_waiting + 1
    pred = np.zeros(total + 1, dtype=np.int64)
    slots = []
    for i in range(n_residents):
        p, o = int(prompts[i]), int(max(outputs[i], 2))
        done = int(rng.integers(1, o))  # outputs produced so far
        s = st.add(i, p, o, computed=p + done - 1, outputs=done, status=ST_RUNNING)
        st.req[s, F_BLOCKS] = cdiv(p + done, ENGINE.block_size)
        st.sc[S_FREE_BLOCKS] -= st.req[s, F_BLOCKS]
        st.running[st.sc[S_NR]] = s
        st.sc[S_NR] += 1
        slots.append(s)
        pred[i] = o
    for j in range(n_waiting):
        i = n_residents + j
        st.add(i, int(prompts[i]), int(outputs[i]))
        pred[i] = outputs[i]
    infl = np.array(slots, dtype=np.int64)
    # the in-flight decode step: every running request gets one token
    st.req[infl, 2] += 1
    plan = StepPlan.new(st.capacity)
    plan.slot[: len(infl)] = infl
    plan.tokens[: len(infl)] = 1
    plan.computed[: len(infl)] = st.req[infl, 2] - 1
    snap = Snapshot(0.0, "bench", st, np.zeros(1, dtype=np.int64), 0, plan, len(infl), -0.004)
    return snap, pred


def run(sizes=(16, 64, 256, 1024), queries: int = 2000, waiting: int = 2, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    wl = generate_workload(WorkloadConfig(requests=max(sizes) + 64 + queries, seed=seed)).requests
    lengths = (wl["prompt_tokens"].to_numpy(), wl["output_tokens"].to_numpy())
    profile = load_profile("qwen3-8b-h100")
    out: dict = {"engine": "qwen3-8b on H100 (budget 32768)", "queries": queries, "waiting": waiting, "sizes": {}}
    for n in sizes:
        snap, pred = busy_state(n, waiting, rng, lengths)
        sfs = SFS(profile, pred)
        q_prompts = lengths[0][-queries:]
        t = time.perf_counter_ns()
        sfs.estimate(snap, Query(len(pred) - 1, 0.0, int(q_prompts[0])))
        warm = (time.perf_counter_ns() - t) / 1e3
        us = np.empty(queries)
        steps = np.empty(queries)
        for i in range(queries):
            q = Query(len(pred) - 1, 0.0, int(q_prompts[i]))
            t = time.perf_counter_ns()
            sfs.estimate(snap, q)
            us[i] = (time.perf_counter_ns() - t) / 1e3
            steps[i] = sfs.last_steps
        out["sizes"][str(n)] = {"median_us": float(np.median(us)), "p99_us": float(np.percentile(us, 99)),
                                "mean_steps": float(steps.mean()), "us_per_step": float(us.sum() / steps.sum()),
                                "warmup_us": warm}
    # linearity: one 64-resident state, queues of long prompts ahead of the query
    points = []
    for ahead in (0, 2, 8, 32, 64, 128):
        snap, pred = busy_state(64, ahead, rng, (np.maximum(lengths[0], 4000), lengths[1]))
        sfs = SFS(profile, pred)
        us, st_ = [], []
        for _ in range(300):
            t = time.perf_counter_ns()
            sfs.estimate(snap, Query(len(pred) - 1, 0.0, 2000))
            us.append((time.perf_counter_ns() - t) / 1e3)
            st_.append(sfs.last_steps)
        points.append((float(np.mean(st_)), float(np.median(us))))
    x, y = np.array(points).T
    slope, intercept = np.polyfit(x, y, 1)
    pred_y = slope * x + intercept
    r2 = 1 - ((y - pred_y) ** 2).sum() / ((y - y.mean()) ** 2).sum()
    out["linearity"] = {"points": [{"steps": a, "median_us": b} for a, b in points], "us_per_step": float(slope),
                        "intercept_us": float(intercept), "r2": float(r2)}
    return out
