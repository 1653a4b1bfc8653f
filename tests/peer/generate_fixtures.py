"""Regenerate the peer-suite fixtures from vLLM's real scheduler.

The peer suite checks latroute's ``vllm-v1`` kernel against the scheduling
scenarios that vLLM's own unit tests pin down on purpose
(``tests/v1/core/test_scheduler.py`` and ``tests/v1/core/test_prefix_caching.py``;
``vllm_tests.tsv`` lists every test found there and what became of it). Each
scenario below is written in our own words: an engine configuration and a few
requests (prompt length, ``max_tokens``, the step they arrive at and, for
prefix caching, their prompt content as block ids). This script builds vLLM's
``Scheduler`` over a mock ``KVCacheConfig`` (no model runs: only the model's
configuration is read), feeds the requests, calls ``schedule()``, fabricates
the model's output (one sampled token for every request whose prompt is fully
computed; ``ignore_eos`` so a request ends at ``max_tokens`` or at
``max_model_len``), calls ``update_from_output()`` and records every step.
The records are written as small JSON fixtures so CI needs no vLLM.

It runs in vLLM's own environment and imports only the standard library and
vLLM. Each vLLM release's records are kept apart, in
``tests/peer/fixtures/<version>/`` (``releases.py``). Regenerate one release
(e.g. to check a new one) from the repository root with the Python of that
release's environment (``LATROUTE_VLLM_PYTHON_0_28_0`` and the like; the
tests read the same variables, and ``LATROUTE_VLLM_PYTHON`` for the
release the kernel follows):

    $LATROUTE_VLLM_PYTHON_0_28_0 tests/peer/generate_fixtures.py

Options: ``--model DIR`` (a model directory whose configuration vLLM can
read; default ``../shared/models/tiny-a`` beside the repository), ``--out
DIR`` (default ``tests/peer/fixtures/<the running vLLM's version>``; the
async fixtures go to its ``async`` folder), ``--only NAME`` (one scenario
of the sync and async sets), ``--mode sync|async|random|both|all|priority``
(both: sync and async; default all: the random set too; priority: the
scenarios under vLLM's priority scheduling policy, ``scenarios.priority_scenarios``,
sync and async, into the release folder's ``priority/`` and
``priority/async/``, recorded for the kernel's release only). A fixture whose content
did not change is left untouched, so ``git diff`` shows exactly what a
rerun changed, and ``diff -r`` between two release folders what a release
changed.

vLLM's API moved inside the window (0.19.1 .. 0.32.0); the few places the
generator follows it are the named "version switches" below
(``scheduler_takes_hash_block_size``, ``batch_queue_depth``,
``stale_output_in_flight``, the engine core's attributes in
``engine_core`` and the futures of ``busy_device_future``), each picking
the running release's form without changing what is recorded.

Random async set (``--mode random``): the seeded scenarios of
``scenarios.random_async_scenarios`` (arrivals at every step, prompts
around and above the budget, small KV pools, shared prefixes, max_model_len
and max_num_seqs limits), recorded in async mode like the others and
written whole to ``async_random.jsonl.gz`` beside them (``random_fixtures``:
one line per scenario; rewritten only when its content changed).

Async mode (``docs/reference/async-scheduling.md``). The same scenarios, and
the async-specific ones of ``async_scenarios()``, run through vLLM's
``AsyncScheduler`` driven by the engine core's own
``EngineCore.step_with_batch_queue`` (the real method, called on an engine
core object holding only what that method reads) over a mock executor whose
``execute_model`` / ``sample_tokens`` return futures: nothing runs on a
device, and the two-deep batch queue decides when each step's outputs are
applied, exactly as in a GPU server. A request samples a token in a step
iff that step is not a prefill chunk for it (``is_prefill_chunk`` right
after ``schedule()``, which is what the model runner's discard mask
computes). One record per call of ``step_with_batch_queue``: the batch it
scheduled (each item with the request's ``num_output_placeholders`` after
``schedule()``), ``completed`` = the call whose batch's outputs it applied
(0: none), the rest as in sync mode.

Token content. Without ``blocks`` a request's prompt is one token value
repeated, unique to the request, so no two requests share a cached block.
With ``blocks`` (prefix caching) block id ``b`` stands for ``block_size``
copies of token ``b + 1``; vLLM chains block hashes over the prefix, so an
id names the same content only after the same preceding ids, exactly as a
trace's ``hash_ids`` do. The prompt's remaining tokens (``prompt`` minus the
blocks) and every sampled token are unique to the request.

Step record (one per ``schedule()`` + ``update_from_output()``):
``batch`` = [[request id, tokens scheduled, computed tokens before], ...] in
vLLM's scheduling order; ``preempted`` = ids preempted by this schedule();
``running`` / ``waiting`` = the queues after schedule(), in order;
``free_blocks_scheduled`` = free KV blocks after schedule();
``finished`` = ids finished by update_from_output(); ``free_blocks`` = free
KV blocks after it. vLLM counts cached-but-unreferenced blocks as free.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

FORMAT = "latroute-vllm-peer/1"
DEFAULT_MODEL = str(Path(__file__).resolve().parents[2].parent / "shared" / "models" / "tiny-a")
MAX_STEPS = 400
RANDOM_MAX_STEPS = 2000


import random_fixtures  # noqa: E402 (beside this script: run by path)
import releases  # noqa: E402
from scenarios import async_scenarios, priority_scenarios, random_async_scenarios, scenarios  # noqa: E402


# ---------------------------------------------------------------- vLLM side
def build_scheduler(eng: dict, model_dir: str, async_scheduling: bool = False, cls=None):
    """vLLM's scheduler (``cls``: a subclass of it, e.g. latroute's recording
    scheduler) over a mock KV cache of ``eng``'s size."""
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=model_dir, max_model_len=eng["max_model_len"], dtype="float32", seed=0)
    sched = SchedulerConfig(max_num_seqs=eng["max_num_seqs"], max_num_batched_tokens=eng["max_num_batched_tokens"],
                            max_model_len=eng["max_model_len"],
                            long_prefill_token_threshold=eng["long_prefill_token_threshold"],
                            enable_chunked_prefill=eng["chunked_prefill"], is_encoder_decoder=False,
                            async_scheduling=async_scheduling, policy=eng.get("scheduling_policy", "fcfs"))
    cache = CacheConfig(block_size=eng["block_size"], enable_prefix_caching=eng["prefix_caching"])
    cache.num_gpu_blocks = eng["num_blocks"]
    config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache)
    spec = FullAttentionSpec(block_size=eng["block_size"], num_kv_heads=1, head_size=1,
                             dtype=STR_DTYPE_TO_TORCH_DTYPE["float32"])
    kv = KVCacheConfig(num_blocks=eng["num_blocks"], kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    if async_scheduling:  # vLLM's CPU platform turns it off (vllm/platforms/cpu.py); the scheduler needs no device
        config.scheduler_config.async_scheduling = True
    if async_scheduling and batch_queue_depth(config) != 2:
        raise RuntimeError("vLLM did not keep async scheduling with a two-deep batch queue for this configuration")
    cls = cls or (AsyncScheduler if async_scheduling else Scheduler)
    extra = {"hash_block_size": eng["block_size"]} if scheduler_takes_hash_block_size(cls) else {}
    return cls(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
               block_size=eng["block_size"], log_stats=True, **extra)


# ------------------------------------------------- version switches (vLLM API)
# Each names one place where vLLM's API moved inside the window the fixtures
# cover (0.19.1 .. 0.32.0) and picks the form of the running release; none
# changes what is recorded.
def scheduler_takes_hash_block_size(cls) -> bool:
    """``Scheduler(hash_block_size=...)`` exists from 0.20 on (0.19 hashes at
    ``block_size``, which is what the fixtures pass anyway)."""
    import inspect

    return "hash_block_size" in inspect.signature(cls.__init__).parameters


def batch_queue_depth(config) -> int:
    """The engine core's batch queue depth: ``VllmConfig.max_concurrent_batches``
    from 0.23 on; up to 0.22 the executor's ``max_concurrent_batches``, which
    is 2 with async scheduling and no pipeline parallelism (the value the
    mock executor gives)."""
    depth = getattr(config, "max_concurrent_batches", None)
    if depth is not None:
        return depth
    return MockExecutor.async_queue_depth(config)


def stale_output_in_flight(r) -> bool:
    """A waiting request whose preempted outputs are still in flight
    (``Request.num_stale_output_tokens``, from 0.27 on; older releases have no
    such state)."""
    return bool(getattr(r, "num_stale_output_tokens", 0)) and not getattr(r, "drop_stale_output", False)


def prompt_tokens(r: dict, index: int, block_size: int) -> list[int]:
    blocks = r.get("blocks", [])
    toks = [b + 1 for b in blocks for _ in range(block_size)]
    if len(toks) > r["prompt"]:
        raise ValueError(f"request {r['id']}: {len(blocks)} blocks exceed a {r['prompt']}-token prompt")
    return toks + [1_000_000 + index] * (r["prompt"] - len(toks))


def add_arrivals(s, pending: list[dict], step: int, reqs: dict, index: dict, block_size: int, hasher) -> None:
    """The requests arriving at ``step`` into vLLM's scheduler, in fixture order
    (``ignore_eos``: they end at max_tokens or max_model_len)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    for r in [r for r in pending if r["arrival_step"] == step]:
        vr = Request(r["id"], prompt_tokens(r, index[r["id"]], block_size),
                     SamplingParams(max_tokens=r["max_tokens"], ignore_eos=True), None,
                     arrival_time=float(step), block_hasher=hasher, priority=r.get("priority", 0))
        reqs[r["id"]] = vr
        s.add_request(vr)
        pending.remove(r)


def run_vllm(sc: dict, model_dir: str) -> dict:
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput

    eng = sc["engine"]
    init_none_hash(sha256)
    s = build_scheduler(eng, model_dir)
    pool = s.kv_cache_manager.block_pool
    hasher = get_request_block_hasher(eng["block_size"], sha256)
    index = {r["id"]: i for i, r in enumerate(sc["requests"])}
    reqs = {}
    pending = list(sc["requests"])
    finished: set[str] = set()
    steps = []
    start = {"free_blocks": pool.get_num_free_blocks()}
    for step in range(1, MAX_STEPS + 1):
        add_arrivals(s, pending, step, reqs, index, eng["block_size"], hasher)
        out = s.schedule()
        ids = list(out.num_scheduled_tokens)
        batch = [[i, n, reqs[i].num_computed_tokens - n] for i, n in out.num_scheduled_tokens.items()]
        record = {"step": step, "batch": batch,
                  "preempted": sorted(out.preempted_req_ids or ()),
                  "running": [r.request_id for r in s.running], "waiting": [r.request_id for r in s.waiting],
                  "free_blocks_scheduled": pool.get_num_free_blocks()}
        if len(getattr(s, "skipped_waiting", ())):
            raise RuntimeError(f"{sc['name']}: step {step}: unexpected skipped_waiting requests")
        sampled = [[2_000_000 + index[i]] if reqs[i].num_computed_tokens >= reqs[i].num_tokens else [] for i in ids]
        s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={i: k for k, i in enumerate(ids)},
                                                    sampled_token_ids=sampled))
        done = [i for i in ids if reqs[i].is_finished() and i not in finished]
        finished.update(done)
        record["finished"] = done
        record["free_blocks"] = pool.get_num_free_blocks()
        steps.append(record)
        if not pending and len(finished) == len(sc["requests"]):
            break
    else:
        raise RuntimeError(f"{sc['name']}: not finished after {MAX_STEPS} steps")
    reasons = {i: str(reqs[i].get_finished_reason()) for i in sorted(reqs)}
    return {"start": start, "steps": steps, "finish_reasons": reasons}


class MockExecutor:
    """The executor of an engine core without a model: ``execute_model``
    returns a future of None (sampling follows; vLLM's empty output for an
    empty batch), ``sample_tokens`` a future
    of the fabricated output of the batch last executed. A request samples a
    token iff the step is not a prefill chunk for it (its
    ``is_prefill_chunk`` right after ``schedule()``, the model runner's
    discard mask); the token is unique to the request."""

    def __init__(self, scheduler, index: dict[str, int]):
        self.scheduler, self.index, self.pending = scheduler, index, None
        # read by the engine core up to 0.22 (later releases read VllmConfig's)
        self.max_concurrent_batches = self.async_queue_depth(scheduler.vllm_config)

    @staticmethod
    def async_queue_depth(config) -> int:
        """What vLLM's executors answered up to 0.22: two batches in flight
        with async scheduling (one without); no pipeline parallelism here."""
        return 2 if config.scheduler_config.async_scheduling else 1

    def execute_model(self, scheduler_output, non_block=False):
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT

        ids = list(scheduler_output.num_scheduled_tokens)
        reqs = self.scheduler.requests
        self.pending = (ids, [[] if reqs[i].is_prefill_chunk else [2_000_000 + self.index[i]] for i in ids])
        return busy_device_future(None if ids else EMPTY_MODEL_RUNNER_OUTPUT)  # the runner's answer to no batch

    def sample_tokens(self, grammar_output, non_block=False):
        from vllm.v1.outputs import ModelRunnerOutput

        ids, sampled = self.pending
        return busy_device_future(ModelRunnerOutput(req_ids=ids, req_id_to_index={i: k for k, i in enumerate(ids)},
                                                    sampled_token_ids=sampled))


def busy_device_future(value):
    """A future holding ``value`` that says it is not done until someone waits
    on it: the device is still busy with a batch when the engine core looks.
    Only vLLM up to 0.22 asks (``step_with_batch_queue`` returned early only
    while the oldest batch's future was not done); later releases wait
    without asking (0.23 on), so their records do not depend on this."""
    from concurrent.futures import Future

    class BusyDevice(Future):
        def done(self):
            return self._waited

        def result(self, timeout=None):
            self._waited = True
            return super().result(timeout)

    fut = BusyDevice()
    fut._waited = False
    fut.set_result(value)
    return fut


def engine_core(scheduler, executor):
    """vLLM's ``EngineCore`` holding only what ``step_with_batch_queue``
    reads: the scheduler, the executor and a batch queue of
    ``max_concurrent_batches`` (2 with async scheduling)."""
    import queue
    from collections import deque

    from vllm.v1.engine.core import EngineCore

    core = object.__new__(EngineCore)
    core.vllm_config = scheduler.vllm_config
    core.scheduler, core.model_executor = scheduler, executor
    core.log_stats = False
    core._weight_version = "default"
    core.batch_queue_size = batch_queue_depth(scheduler.vllm_config)
    core.batch_queue = deque(maxlen=core.batch_queue_size)
    core.is_mm_encoder_only = False  # from 0.31; up to 0.30 the same test reads is_ec_consumer (True without EC)
    core.is_ec_consumer = True
    core.is_pooling_model = False
    core.check_for_draft_tokens = False  # from 0.24 on; up to 0.22 use_spec_decode
    core.use_spec_decode = False
    core.async_scheduling = True
    core.aborts_queue = queue.Queue()
    return core


def run_vllm_async(sc: dict, model_dir: str, max_steps: int = MAX_STEPS) -> dict:
    """The scenario through ``AsyncScheduler`` and the engine core's own
    ``step_with_batch_queue``: one record per call (see module doc)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.engine.core import EngineCore

    eng = sc["engine"]
    init_none_hash(sha256)
    s = build_scheduler(eng, model_dir, async_scheduling=True)
    pool = s.kv_cache_manager.block_pool
    hasher = get_request_block_hasher(eng["block_size"], sha256)
    index = {r["id"]: i for i, r in enumerate(sc["requests"])}
    core = engine_core(s, MockExecutor(s, index))
    reqs = {}
    pending = list(sc["requests"])
    finished: set[str] = set()
    steps = []
    calls_of = {}  # id(scheduler_output) -> the call that scheduled it
    start = {"free_blocks": pool.get_num_free_blocks()}
    original_schedule, original_update = s.schedule, s.update_from_output
    seen: dict = {}

    def schedule(*a, **k):  # the record's schedule part, before the same call applies older outputs
        stale = [r.request_id for r in s.waiting if stale_output_in_flight(r)]
        if stale:  # pass 2 would skip them: a rule the kernel does not carry (it cannot fire two deep, FCFS)
            raise RuntimeError(f"{sc['name']}: call {seen['step']}: waiting requests with stale output in flight "
                               f"{stale}")
        out = original_schedule(*a, **k)
        seen["out"] = out
        calls_of[id(out)] = seen["step"]
        seen["sched"] = {
            "batch": [[i, n, reqs[i].num_computed_tokens - n, reqs[i].num_output_placeholders]
                      for i, n in out.num_scheduled_tokens.items()],
            "preempted": sorted(out.preempted_req_ids or ()),
            "running": [r.request_id for r in s.running], "waiting": [r.request_id for r in s.waiting],
            "free_blocks_scheduled": pool.get_num_free_blocks()}
        return out

    def update(so, mro):
        seen["completed"] = calls_of[id(so)]
        return original_update(so, mro)

    s.schedule, s.update_from_output = schedule, update
    for step in range(1, max_steps + 1):
        add_arrivals(s, pending, step, reqs, index, eng["block_size"], hasher)
        seen.clear()
        seen["step"] = step
        EngineCore.step_with_batch_queue(core)
        record = {"step": step, **seen.get("sched", {"batch": [], "preempted": [], "running": None,
                                                    "waiting": None, "free_blocks_scheduled": None})}
        steps.append(record)
        record["completed"] = seen.get("completed", 0)
        done = [i for i in reqs if reqs[i].is_finished() and i not in finished]
        finished.update(done)
        record["finished"] = sorted(done, key=lambda i: index[i])
        record["free_blocks"] = pool.get_num_free_blocks()
        if not pending and len(finished) == len(sc["requests"]) and not core.batch_queue and not s.has_requests():
            break
    else:
        raise RuntimeError(f"{sc['name']}: not finished after {max_steps} steps")
    reasons = {i: str(reqs[i].get_finished_reason()) for i in sorted(reqs)}
    return {"start": start, "steps": steps, "finish_reasons": reasons}


def fixture_text(sc: dict, result: dict, vllm_version: str) -> str:
    """JSON with one step per line, so a diff between vLLM releases reads
    step by step."""
    head = {"format": FORMAT, "vllm_version": vllm_version, **{k: v for k, v in sc.items() if k != "requests"},
            "start": result["start"], "finish_reasons": result["finish_reasons"]}
    lines = json.dumps(head, indent=1)
    assert lines.endswith("\n}")

    def rows(items):
        return ",\n  ".join(json.dumps(x, separators=(",", ":")) for x in items)

    return (f'{lines[:-2]},\n "requests": [\n  {rows(sc["requests"])}\n ],\n'
            f' "steps": [\n  {rows(result["steps"])}\n ]\n}}\n')


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--out", default=None, help="default: tests/peer/fixtures/<the running vLLM's version>")
    ap.add_argument("--only", default=None)
    ap.add_argument("--mode", choices=("sync", "async", "random", "both", "all", "priority"), default="all")
    args = ap.parse_args(argv)
    if not Path(args.model, "config.json").is_file():
        print(f"error: --model {args.model}: no config.json (a model directory vLLM can read)", file=sys.stderr)
        return 2
    import vllm

    out = Path(args.out) if args.out else releases.folder(vllm.__version__)
    runs = []  # (scenario, runner, folder)
    if args.mode in ("sync", "both", "all"):
        runs += [(sc, run_vllm, out) for sc in scenarios()]
    if args.mode in ("async", "both", "all"):
        runs += [(sc, run_vllm_async, out / "async") for sc in scenarios() + async_scenarios()]
    if args.mode == "priority":  # a folder of their own: the release matrix (--mode all) is unchanged
        runs += [(sc, run_vllm, out / releases.PRIORITY) for sc in priority_scenarios()]
        runs += [(sc, run_vllm_async, out / releases.PRIORITY / "async") for sc in priority_scenarios()]
    chosen = [r for r in runs if args.only in (None, r[0]["name"])]
    if args.only is not None and not chosen:
        print(f"error: --only {args.only}: no {args.mode} scenario of that name (the random set is written whole)",
              file=sys.stderr)
        return 2
    changed = 0
    for sc, runner, folder in chosen:
        folder.mkdir(parents=True, exist_ok=True)
        if runner is run_vllm_async:  # the sync fixtures keep their bytes
            sc = {**sc, "async_scheduling": True}
        text = fixture_text(sc, runner(sc, args.model), vllm.__version__)
        path = folder / f"{sc['name']}.json"
        same = path.exists() and path.read_text() == text
        if not same:
            path.write_text(text)
            changed += 1
        last = json.loads(text)["steps"][-1]
        print(f"{'async ' if sc.get('async_scheduling') else 'sync  '}{sc['name']:45s} {len(json.loads(text)['steps']):3d} "
              f"steps  free blocks at end {last['free_blocks']:5d}  {'unchanged' if same else 'written'}")
    if chosen:
        print(f"vLLM {vllm.__version__}: {len(chosen)} scenarios, {changed} fixtures written")
    if args.mode in ("random", "all") and args.only is None:
        write_random(out / releases.RANDOM_NAME, args.model, vllm.__version__)
    return 0


def write_random(path: Path, model_dir: str, vllm_version: str) -> None:
    """The random async set, recorded and written whole (left untouched when
    its content is the same)."""
    lines = []
    for sc in random_async_scenarios():
        sc = {**sc, "async_scheduling": True}
        lines.append(random_fixtures.pack(sc, run_vllm_async(sc, model_dir, RANDOM_MAX_STEPS), vllm_version))
    text = "".join(line + "\n" for line in lines)
    same = path.exists() and random_fixtures.read_text(path) == text
    if not same:
        path.parent.mkdir(parents=True, exist_ok=True)
        random_fixtures.write(path, lines)
    steps = [len(random_fixtures.unpack(line)["steps"]) for line in lines]
    print(f"vLLM {vllm_version}: {len(lines)} random async scenarios, {sum(steps)} calls (longest {max(steps)}), "
          f"{path} {'unchanged' if same else 'written'}")

if __name__ == "__main__":
    sys.exit(main())
