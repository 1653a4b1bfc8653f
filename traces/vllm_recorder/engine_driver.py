"""Open-loop replay of a workload through an in-process vLLM engine.

Run by ``latroute record engine`` in vLLM's interpreter:
``python -m traces.vllm_recorder.engine_driver SPEC.json``. The spec (written
by ``harness/live/record.py``) names the model, the engine arguments and the
requests (id, arrival_s, prompt_tokens, output_tokens, hash_ids).

The loop is a serving front end's, without HTTP: between two engine steps
it hands over every request whose arrival time has passed (so ``added_s`` is
the first step boundary at or after ``arrival_s``, PROVENANCE's rule), then
runs one step; when the engine is idle it sleeps until the next arrival.
Prompts are token ids built before the clock starts (``prompts``), outputs
have exactly ``output_tokens`` tokens (``ignore_eos``, ``max_tokens``). A
short warm-up runs before the recording starts and is not recorded, as in
``shared/data/vllm_cpu``.
"""
from __future__ import annotations

import json
import os
import sys
import time

from traces.vllm_recorder import scheduler as rec
from traces.vllm_recorder.prompts import prompt_token_ids

SCHEDULER_CLS = "traces.vllm_recorder.scheduler.RecordingScheduler"


def _engine(spec: dict):
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    args = EngineArgs(model=spec["model"], load_format="dummy", enforce_eager=True, scheduler_cls=SCHEDULER_CLS,
                      **spec["engine"])
    return LLMEngine.from_engine_args(args)


def _run(engine, batch: list[tuple[str, list[int], int]]) -> None:
    from vllm import SamplingParams

    for rid, ids, out in batch:
        engine.add_request(rid, {"prompt_token_ids": ids}, SamplingParams(max_tokens=out, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    os.environ[rec.ENV_DIR] = spec["out"]
    os.environ[rec.ENV_PAUSED] = "1"
    os.environ[rec.ENV_MODEL_NAME] = spec["model_name"]
    from vllm import SamplingParams

    engine = _engine(spec)
    core = engine.engine_core.engine_core  # InprocClient -> EngineCore (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    sched = core.scheduler
    block = int(spec["hash_block_tokens"])
    seed = spec["prompt_seed"]
    reqs = [(f"r{rid}", float(arr), prompt_token_ids(int(p), h, block, f"{seed}:{rid}"), int(o))
            for rid, arr, p, o, h in spec["requests"]]
    _run(engine, [(f"warmup-{k}", prompt_token_ids(256, None, block, f"warmup:{k}"), 8)
                  for k in range(int(spec.get("warmup", 2)))])
    sched.start_recording()
    p0, w0 = sched.recording_clock()
    limit = float(spec["time_limit_s"])
    i, n = 0, len(reqs)
    while i < n or engine.has_unfinished_requests():
        now = time.perf_counter() - p0
        if now > limit:
            print(f"record engine: time limit {limit:g} s reached with {n - i} requests not sent", file=sys.stderr)
            core.shutdown()
            return 1
        while i < n and reqs[i][1] <= now:
            rid, arr, ids, out = reqs[i]
            engine.add_request(rid, {"prompt_token_ids": ids}, SamplingParams(max_tokens=out, ignore_eos=True),
                               arrival_time=w0 + arr)
            i += 1
        if engine.has_unfinished_requests():
            engine.step()
        elif i < n:
            time.sleep(max(0.0, min(reqs[i][1] - (time.perf_counter() - p0), 0.05)))
    core.shutdown()  # EngineCore.shutdown -> scheduler.shutdown: the recording is closed and joined
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
