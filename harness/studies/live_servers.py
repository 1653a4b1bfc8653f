"""The live study's processes (``harness.studies.route_live``): real vLLM
servers pinned to a core each with latroute's recording scheduler, and the
latroute commands it runs (loadgen, validate, ...) as bounded child
processes. Apart from the study's logic so that logic reads as the method."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from harness.live.ports import free_port_base

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO.parent / "shared" / "models"
RECORDER = "traces.vllm_recorder.scheduler.RecordingScheduler"
ENGINE_ARGS = ["--max-num-batched-tokens", "512", "--max-num-seqs", "64", "--max-model-len", "4096"]
START_S, RUN_S = 300.0, 900.0


def latroute_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "harness.cli", *map(str, args)]


def run_checked(args: list[str], cwd: Path, timeout: float, ok=(0,)) -> subprocess.CompletedProcess:
    r = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    if r.returncode not in ok:
        raise RuntimeError(f"{' '.join(args[2:5])} failed ({r.returncode}): {r.stderr[-2000:]}")
    return r


# --- backends -------------------------------------------------------------------------------------------------------

class VllmServer:
    """One real vLLM server, pinned to ``core``, recording into ``record``;
    its own process group, so a stop reaches the engine core too. With
    ``state_port``, the recording scheduler also publishes the engine's
    state there (``traces.vllm_recorder.state_feed``: ``--view exact``'s
    source, at ``state_url``)."""

    def __init__(self, python: str, name: str, core: int, port: int, record: Path, log: Path,
                 state_port: int | None = None):
        self.url, self.record = f"http://127.0.0.1:{port}", record
        self.state_url = f"http://127.0.0.1:{state_port}" if state_port else None
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": str(core), "PYTHONPATH": str(REPO),
               "LATROUTE_RECORD_DIR": str(record), "LATROUTE_RECORD_MODEL_NAME": name}
        if state_port:
            env["LATROUTE_STATE_LISTEN"] = f"127.0.0.1:{state_port}"
        cmd = ["taskset", "-c", str(core), python, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(MODELS / name), "--served-model-name", name, "--load-format", "dummy",
               "--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
               "--gpu-memory-utilization", "0.1", *ENGINE_ARGS, "--no-enable-prefix-caching",
               "--shutdown-timeout", "20", "--scheduler-cls", RECORDER]
        self._log = open(log, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, seconds: float = START_S) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited ({self.proc.returncode}) before {self.url} was healthy")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1):
                    return
            except OSError:
                time.sleep(1)
        raise RuntimeError(f"{self.url} not healthy after {seconds:g} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        end = time.monotonic() + 30  # the engine core closes the recording as it shuts down: give it time
        try:
            while time.monotonic() < end:
                os.killpg(self.proc.pid, 0)
                time.sleep(0.5)
            os.killpg(self.proc.pid, signal.SIGKILL)  # an engine core left behind by its API server
        except ProcessLookupError:
            pass
        self._log.close()
        if (self.record / "engine.json").is_file() and not (self.record / "requests.csv").is_file():
            try:  # a hard stop left the recording in parts
                run_checked(latroute_cmd("record", "finish", self.record), self.record.parent, 300)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"warning: {self.record}: {e}", file=sys.stderr)


def start_real(stack: ExitStack, python: str, names: list[str], parent: Path,
               feeds: bool = False) -> tuple[list[str], Path, list[str | None]]:
    """tiny-a on core 0, tiny-b on core 1 (names in pool order): their URLs,
    this start's directory (``parent/sessionK``, the first free K: a
    recording never goes into a used directory) and, with ``feeds``, each
    one's state feed URL (for ``--view exact``; else None), stopped when
    ``stack`` closes."""
    k = 0
    while (parent / f"session{k}").exists():
        k += 1
    out = parent / f"session{k}"
    out.mkdir(parents=True)
    n = len(names)
    base = free_port_base(2 * n if feeds else n)
    servers = []
    for k, name in enumerate(names):
        s = VllmServer(python, name, k % os.cpu_count(), base + k, out / f"rec-{name}", out / f"server-{name}.log",
                       state_port=base + n + k if feeds else None)
        stack.callback(s.stop)
        servers.append(s)
    for s in servers:
        s.wait_healthy()
    return [s.url for s in servers], out, [s.state_url for s in servers]


def warm_up(urls: list[str], work: Path) -> None:
    """A few requests to each server (not in the study): first-call costs."""
    for k, url in enumerate(urls):
        run_checked(latroute_cmd("loadgen", "--base-url", url, "--num-prompts", 6, "--request-rate", 3, "--input-len", 256,
                       "--output-len", 16, "--id-prefix", "warm", "--out", work / f"warm-{k}", "--force"), work, 300)


def send(target: list[str], trace: Path, out: Path, work: Path, extra=()) -> None:
    """loadgen the workload; a run with failed requests is kept (they count as late)."""
    run_checked(latroute_cmd("loadgen", *target, "--trace", trace, "--out", out, "--force", "--time-limit", int(RUN_S - 60),
                   *extra), work, RUN_S, ok=(0, 1))
    if not (out / "meta.json").is_file():
        raise RuntimeError(f"loadgen wrote nothing to {out}")
