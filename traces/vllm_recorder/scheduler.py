"""``RecordingScheduler``: vLLM V1's own scheduler, recording every step.

Use it as ``--scheduler-cls traces.vllm_recorder.scheduler.RecordingScheduler``
(engine argument ``scheduler_cls``) with latroute's root on ``PYTHONPATH``
and ``LATROUTE_RECORD_DIR`` naming an empty output directory. It imports
only vLLM and the standard library.

What is recorded, and why it is exact (vLLM 0.32.0, ``vllm/v1/core/sched/``):

- A step is one ``schedule()`` followed by one ``update_from_output()``
  (``EngineCore.step``). ``start_s`` is taken on entry to ``schedule()``,
  ``end_s`` on return from ``update_from_output()``: the recordings'
  definition. Steps that schedule nothing are not steps of the format and are
  skipped (numbering stays dense).
- Items: ``SchedulerOutput.num_scheduled_tokens`` in insertion order, which is
  the order the scheduler chose them (running first, then waiting).
  ``schedule()`` has already advanced ``num_computed_tokens`` by the
  scheduled count (``_update_after_schedule``), so computed-at-chunk-start
  is ``num_computed_tokens - tokens``; for a new request it is its
  prefix-cache hit, as in d8-d10.
- Preemptions: ``_preempt_request`` is wrapped, so ids come in the order
  vLLM preempted them (``SchedulerOutput.preempted_req_ids`` is a set).
- Requests: ``added_s`` when ``add_request`` ran (the engine core adds
  requests between steps); ``arrival_s`` from ``Request.arrival_time``,
  stamped by the front end with ``time.time()`` and moved onto the
  recording's clock by the wall/monotonic pair taken at start;
  ``first_token_s`` the end of the step that computed the last prompt token;
  ``finish_s`` the end of the step in which it finished, or the time an
  abort (``finish_requests``, e.g. a client that disconnected) reached the
  scheduler (``status`` says which). ``cached_tokens`` is the hit granted
  at first scheduling; ``hash_ids`` are chained content hashes of the
  prompt's full blocks (the writer thread computes them).
- ``client_id``: the id the client sent. vLLM's OpenAI server makes the
  engine id ``cmpl-<X-Request-Id>-<prompt index>-<8 random chars>``
  (``serving.py`` ``_base_request_id`` and ``InputProcessor.assign_request_id``);
  ``LLMEngine.add_request(id)`` gives ``<id>-<8 random chars>``. The prefix,
  index and suffix are stripped, so a client joins on its own id.

Shutdown: the recording is closed (open requests written as
``unfinished``, parts joined, ``recorder.json`` written) by
``Scheduler.shutdown`` or at interpreter exit. vLLM's server kills its
engine-core process at once on SIGTERM unless ``--shutdown-timeout N`` gives
it time, so pass e.g. ``--shutdown-timeout 20``; after a hard kill the parts
(flushed whenever the writer is idle) are joined by ``latroute record finish
DIR``, without ``recorder.json`` and without rows for requests in flight.

State feed: with ``LATROUTE_STATE_LISTEN=127.0.0.1:PORT`` the scheduler
also publishes its state after every change on that port
(``state_feed``), for ``latroute route --view exact``.

The recorder's own cost per step (building the item list, bookkeeping, the
queue hand-off: everything the wrapper adds to the engine thread) is timed
with ``perf_counter`` and summarised in ``recorder.json`` at close.
"""
from __future__ import annotations

import atexit
import json
import os
import platform
import sys
import time
from array import array
from pathlib import Path

import vllm
from vllm.v1.core.sched.scheduler import Scheduler

from traces.errors import BadInput
from traces.vllm_recorder.files import DEFAULT_ROTATE_BYTES, RecordingWriter, finish_recording
from traces.vllm_recorder.ids import client_id_of
from traces.vllm_recorder.release import refusal
from traces.vllm_recorder.state_feed import ENV_LISTEN, StateFeed, frame, parse_listen

ENV_DIR = "LATROUTE_RECORD_DIR"
ENV_ROTATE_MB = "LATROUTE_RECORD_ROTATE_MB"
ENV_MODEL_NAME = "LATROUTE_RECORD_MODEL_NAME"
ENV_PAUSED = "LATROUTE_RECORD_PAUSED"  # "1": start paused (a driver warms up, then calls start_recording)
class _Req:
    __slots__ = ("req", "arrival_s", "added_s", "first_token_s", "cached", "client_id", "prompt_ids")


class RecordingScheduler(Scheduler):
    """vLLM's ``Scheduler`` plus a recording (module doc). Subclasses the
    synchronous scheduler on purpose: the recordings and the kernel model
    async scheduling off (vLLM's CPU build runs it off by default; elsewhere
    pass ``--no-async-scheduling``, which ``__init__`` insists on: with a
    batch queue step n+1 is planned before step n's output is applied, which
    a one-step-at-a-time recording cannot represent)."""

    def __init__(self, *args, **kwargs) -> None:
        why = refusal(vllm.__version__)  # a server is started without latroute's front end: refuse here too
        if why:
            raise RuntimeError(f"RecordingScheduler: {why}")
        super().__init__(*args, **kwargs)
        if batch_queue_depth(self.vllm_config) > 1 or self.scheduler_config.async_scheduling:
            # the batch queue schedules step n+1 before step n's output is applied;
            # the format (and the kernel) assume one step at a time
            raise RuntimeError("RecordingScheduler records engines that run one step at a time: "
                               "pass --no-async-scheduling (and no pipeline parallelism)")
        out = os.environ.get(ENV_DIR)
        if not out:
            raise RuntimeError(f"RecordingScheduler: set {ENV_DIR} to the recording's output directory")
        self._rec_dir = Path(out)
        self._rec_dir.mkdir(parents=True, exist_ok=True)
        if any(self._rec_dir.iterdir()):
            raise RuntimeError(f"RecordingScheduler: {self._rec_dir} is not empty (never overwrite a recording)")
        self._rec_closed = False
        self._rec_on = os.environ.get(ENV_PAUSED, "") != "1"
        self._rec_reqs: dict[str, _Req] = {}
        self._rec_preempted: list[str] = []
        self._rec_pending: tuple | None = None
        self._rec_overhead_us = array("d")
        self._rec_add_us = 0.0
        self._rec_sched_us = 0.0
        self._rec_step_s = 0.0
        self._rec_step = 0
        self._rec_t0 = time.perf_counter()
        self._rec_w0 = time.time()
        self._rec_write_engine_json()
        rotate = int(float(os.environ.get(ENV_ROTATE_MB, DEFAULT_ROTATE_BYTES / (1 << 20))) * (1 << 20))
        self._rec_writer = RecordingWriter(self._rec_dir, self.cache_config.block_size, max(rotate, 1 << 12))
        self._rec_writer.start()
        # the state feed (``state_feed``): this engine's scheduler state after every change, for
        # ``latroute route --view exact``; only with LATROUTE_STATE_LISTEN=127.0.0.1:PORT
        listen = os.environ.get(ENV_LISTEN)
        self._feed = StateFeed(*parse_listen(listen)) if listen else None
        self._feed_inflight: tuple | None = None
        self._feed_step = 0
        atexit.register(self._rec_close)

    # -- engine configuration ------------------------------------------------
    def _rec_write_engine_json(self) -> None:
        sc, cc, mc = self.scheduler_config, self.cache_config, self.vllm_config.model_config
        model_dir = Path(str(mc.model))
        cfg_file = model_dir / "config.json"
        model_config = json.loads(cfg_file.read_text()) if cfg_file.is_file() else None
        cpu = next((ln.split(":", 1)[1].strip() for ln in _read("/proc/cpuinfo").splitlines()
                    if ln.startswith("model name")), platform.processor())
        try:
            import torch
            threads = torch.get_num_threads()
        except Exception:  # noqa: BLE001 - informative only
            threads = None
        from vllm.platforms import current_platform
        eng = {
            "budget": int(sc.max_num_batched_tokens),
            "max_seqs": int(sc.max_num_seqs),
            "block_size": int(cc.block_size),
            "num_kv_blocks": int(self.kv_cache_config.num_blocks),
            "model": os.environ.get(ENV_MODEL_NAME) or model_dir.name,
            "async_scheduling": bool(sc.async_scheduling),
            "long_prefill": int(sc.long_prefill_token_threshold or 0),
            "prefix_caching": bool(cc.enable_prefix_caching),
            "max_model_len": int(mc.max_model_len),
            "kv_blocks_override": int(cc.num_gpu_blocks_override or 0),
            "dtype": str(mc.dtype).removeprefix("torch."),
            "vllm_version": vllm.__version__,
            "model_path": str(mc.model),
            "model_config": model_config,
            "platform": (f"{current_platform.device_type} ({platform.machine()}, {os.cpu_count()} cores, {cpu}), "
                         f"{threads} torch threads"),
            "recorder": "latroute RecordingScheduler (live engine)",
            "hash_block_tokens": int(cc.block_size),
        }
        (self._rec_dir / "engine.json").write_text(json.dumps(eng, indent=1) + "\n")

    def start_recording(self) -> None:
        """Start a paused recording now (time zero, step 0): a driver's
        warm-up before this call is not recorded. Requests alive at this
        moment would be recorded without their beginning, so call it idle."""
        if self._rec_reqs or self.requests:
            raise RuntimeError("start_recording: the engine still has requests")
        self._rec_t0 = time.perf_counter()
        self._rec_w0 = time.time()
        self._rec_on = True

    def recording_clock(self) -> tuple[float, float]:
        """(perf_counter, time.time) at the recording's time zero."""
        return self._rec_t0, self._rec_w0

    # -- the wrapped scheduler interface -------------------------------------
    def add_request(self, request) -> None:
        t = time.perf_counter()
        known = request.request_id in self.requests
        super().add_request(request)
        self._feed_publish()
        if not self._rec_on or known:
            return
        t1 = time.perf_counter()
        st = _Req()
        st.req = request
        st.arrival_s = request.arrival_time - self._rec_w0
        st.added_s = t - self._rec_t0
        st.first_token_s = None
        st.cached = None
        st.client_id = client_id_of(request.request_id)
        ids = request.prompt_token_ids
        st.prompt_ids = list(ids) if ids is not None else None
        self._rec_reqs[request.request_id] = st
        self._rec_add_us += 1e6 * (time.perf_counter() - t1)  # charged to the next step

    def _preempt_request(self, request, *args, **kwargs) -> None:
        super()._preempt_request(request, *args, **kwargs)
        if self._rec_on:
            self._rec_preempted.append(request.request_id)

    def schedule(self, *args, **kwargs):
        start = time.perf_counter()
        self._rec_preempted = []
        out = super().schedule(*args, **kwargs)
        feed = self._feed is not None and self._feed.wanted
        if not (self._rec_on or feed):
            return out
        t1 = time.perf_counter()
        items = []  # the batch, once, for the recording and the state feed alike
        if out.total_num_scheduled_tokens:
            reqs, recs = self.requests, self._rec_reqs if self._rec_on else {}
            for rid, n in out.num_scheduled_tokens.items():
                r = reqs[rid]
                before = r.num_computed_tokens - n
                items.append([rid, n, before, r.num_prompt_tokens])
                st = recs.get(rid)
                if st is not None and st.cached is None:
                    st.cached = before
        if self._rec_on:
            self._rec_pending = (start, items, self._rec_preempted) if items else None
            self._rec_sched_us = 1e6 * (time.perf_counter() - t1)
        if feed:
            self._feed_inflight = (start, items) if items else None
            self._feed_publish()
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        result = super().update_from_output(scheduler_output, model_runner_output)
        if self._feed is not None:
            self._feed_inflight = None
            self._feed_step += 1
            self._feed_publish()
        pending = self._rec_pending
        if pending is None or not self._rec_on:
            return result
        end = time.perf_counter()
        self._rec_pending = None
        start, items, preempted = pending
        t0 = self._rec_t0
        end_s = end - t0
        recs = self._rec_reqs
        for rid, n, before, prompt in items:
            st = recs.get(rid)
            if st is None:
                continue
            if st.first_token_s is None and before + n >= prompt:
                st.first_token_s = end_s
            if st.req.is_finished():
                self._rec_finish(rid, end_s)
        self._rec_writer.put(("step", self._rec_step, start - t0, end_s, items, preempted))
        self._rec_step += 1
        self._rec_step_s += end - start
        self._rec_overhead_us.append(self._rec_add_us + self._rec_sched_us + 1e6 * (time.perf_counter() - end))
        self._rec_add_us = 0.0
        return result

    def finish_requests(self, request_ids, finished_status):
        out = super().finish_requests(request_ids, finished_status)
        self._feed_publish()
        if self._rec_on:
            now = time.perf_counter() - self._rec_t0
            for rid in [rid for rid, st in self._rec_reqs.items() if st.req.is_finished()]:
                self._rec_finish(rid, now)
        return out

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            self._rec_close()

    def _feed_publish(self) -> None:
        if self._feed is not None:
            self._feed.publish(lambda: frame(self, self._feed_step, self._feed_inflight, client_id_of))

    # -- requests and close --------------------------------------------------
    def _rec_finish(self, rid: str, finish_s: float | None) -> None:
        st = self._rec_reqs.pop(rid)
        r = st.req
        status = str(getattr(r.status, "name", r.status)).lower() if finish_s is not None else "unfinished"
        row = {
            "id": rid, "arrival_s": st.arrival_s, "added_s": st.added_s, "prompt_tokens": r.num_prompt_tokens,
            "output_tokens": r.num_output_tokens, "first_token_s": st.first_token_s, "finish_s": finish_s,
            "ttft_s": None if st.first_token_s is None else st.first_token_s - st.arrival_s,
            "cached_tokens": st.cached, "client_id": st.client_id, "status": status,
        }
        self._rec_writer.put(("request", row, st.prompt_ids))

    def _rec_close(self) -> None:
        """Write what is still open, stop the writer, join the parts. Runs on
        ``shutdown()`` and at interpreter exit, whichever comes first."""
        if self._rec_closed:
            return
        self._rec_closed = True
        feed = self._feed.close() if self._feed is not None else None
        for rid in list(self._rec_reqs):
            self._rec_finish(rid, None)
        self._rec_writer.stop()
        try:
            joined = finish_recording(self._rec_dir)
        except BadInput as e:  # a part refused: kept as it is, for the user to see (record finish names it)
            print(f"latroute recorder: parts not joined: {e}", file=sys.stderr)
            joined = {"error": str(e)}
        us = sorted(self._rec_overhead_us)
        n = self._rec_step
        summary = {
            "steps": n,
            "step_time_s": self._rec_step_s,
            "recorder_time_s": sum(us) / 1e6,
            "recorder_us_per_step": {
                "mean": sum(us) / n if n else None,
                "p50": _q(us, 0.5), "p90": _q(us, 0.9), "p99": _q(us, 0.99), "max": us[-1] if us else None,
            },
            "step_ms_mean": 1e3 * self._rec_step_s / n if n else None,
            "recorder_share_of_step_time": (sum(us) / 1e6) / self._rec_step_s if self._rec_step_s else None,
            "measured": "perf_counter around the wrapper's own work in schedule and update_from_output, plus "
                        "add_request's bookkeeping charged to the following step",
            "parts_joined": joined,
            "writer_error": repr(self._rec_writer.error) if self._rec_writer.error else None,
            "state_feed": feed,
        }
        (self._rec_dir / "recorder.json").write_text(json.dumps(summary, indent=1) + "\n")


# ------------------------------------------------- version switches (vLLM API)
# Each names one place where vLLM's API moved inside the window the recorder
# supports (``release.WINDOW``) and picks the running release's form; none
# changes what is recorded (``docs/reference/vllm-releases.md``, "The recorder
# per release").
def batch_queue_depth(vllm_config) -> int:
    """How many batches the engine core keeps in flight:
    ``VllmConfig.max_concurrent_batches`` from 0.23 on; up to 0.22 only the
    executor knew it (not built yet when the scheduler is): the pipeline's
    depth, or 2 with async scheduling and no pipeline parallelism."""
    depth = getattr(vllm_config, "max_concurrent_batches", None)
    if depth is not None:
        return int(depth)
    pp = int(vllm_config.parallel_config.pipeline_parallel_size)
    return 2 if pp <= 1 and vllm_config.scheduler_config.async_scheduling else pp


def _q(sorted_vals, q: float) -> float | None:
    if not sorted_vals:
        return None
    return sorted_vals[min(len(sorted_vals) - 1, int(q * len(sorted_vals)))]


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""
