"""Regenerate the "against a real vLLM" section of
docs/results/serve-faithfulness.md: does ``latroute serve``,
with a profile calibrated on a recording of a real vLLM server, answer a
workload as a real vLLM server does, as closely as a second real run does?

Why a script: one measurement is a dozen processes in order (three real
vLLM 0.32 CPU servers one after another, the first with the recording
scheduler; a calibration; two ``serve`` runs; loadgen against each; a
/metrics sampler beside each) and a comparison; the script runs them on
loopback, each bounded in time, and prints the figures.

Steps (OUT/ holds everything):

0. ``real0``: a warm-up run, exactly as real1 below, that informs nothing
   and is scored against nothing. In the first three repetitions (without
   it) the first real run was the fastest of the three every time, so the
   emulation, fitted on it, inherited a speed the held-out runs did not
   have; real0 shows whether "first after a pause" is the cause.
1. ``real1``: a real tiny-a server (recording scheduler on, prefix caching
   off, pinned to core 1), a short warm-up, then ``loadgen --trace WL``
   (pinned to core 0) while /metrics is sampled once a second.
2. ``calibrate`` real1's recording into OUT/tiny-a.json and a one-instance
   pool file (real1's engine settings); the front end's time two ways
   (``front_end``): the join's median API overhead (client TTFT - engine
   TTFT), and the constant that best fits the offline twin's TTFTs on
   real1's arrivals to real1's client TTFTs (in-sample MAPE).
3. ``real2``, ``real3``: the same server and workload again, back to back.
4. ``serve-fo0``: ``latroute serve`` on the pool file, no front-end wait:
   its own HTTP path (client TTFT - recorded TTFT, median) is measured.
5. ``serve-join``, ``serve``: the same with ``--frontend-overhead`` = the
   join's, resp. the fitted front end - serve's own path, so the client
   sees the real front end's time once.

Only real1 informs the emulation (profile, engine settings, front end);
real2 and real3 are the held-out runs it is scored against.

``latroute study serve-real OUT --workload WL --vllm-python PY [--port 18765] [--noise off]``
``latroute study serve-real OUT --compare-only`` (re-read OUT)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO.parent / "shared" / "models"
ENGINE = ["--max-num-batched-tokens", "512", "--max-num-seqs", "64", "--max-model-len", "4096"]
SERIES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
          "vllm:kv_cache_usage_perc": "kv_usage"}
REAL_CORE, CLIENT_CORE = "1", "0"


def run(args: list, **kw) -> subprocess.Popen:
    print(" ".join(map(str, args)), flush=True)
    return subprocess.Popen(list(map(str, args)), **kw)


def latroute(*args) -> list:
    return [sys.executable, "-m", "harness.cli", *args]


def wait_healthy(url: str, proc: subprocess.Popen, seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}) before {url} was healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                return
        except OSError:
            time.sleep(1)
    raise SystemExit(f"{url} not healthy after {seconds} s")


class MetricsSampler(threading.Thread):
    """GET /metrics once a second; running, waiting and KV usage per sample
    (prometheus-client's text parser, as a dashboard reads them). The
    first sample is taken when the workload's first request is on the
    engine (polled every 50 ms until then), so the series of two runs
    line up to within that, whatever loadgen's start-up took."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.rows, self.stop = url, [], threading.Event()

    def sample(self) -> dict | None:
        from prometheus_client.parser import text_string_to_metric_families

        try:
            with urllib.request.urlopen(self.url + "/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        row = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name in SERIES:
                    row[SERIES[s.name]] = s.value
        return row

    def run(self) -> None:
        while not self.stop.is_set():
            row = self.sample()
            if row and row.get("running", 0) + row.get("waiting", 0) > 0:
                break
            self.stop.wait(0.05)
        t0 = time.monotonic()
        k = 0
        while not self.stop.is_set():
            row = self.sample() if k else row
            if row is not None:
                self.rows.append({"t_s": round(time.monotonic() - t0, 3), **row})
            k += 1
            self.stop.wait(max(0.0, t0 + k - time.monotonic()))


def drive(url: str, workload: Path, out: Path, n: int) -> None:
    """Warm-up (8 requests, not scored), then the workload with /metrics
    sampled; loadgen pinned to the client's core."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    pin = ["taskset", "-c", CLIENT_CORE]
    if run(pin + latroute("loadgen", "--base-url", url, "--num-prompts", 8, "--request-rate", 4, "--input-len", 256,
                          "--output-len", 16, "--id-prefix", "warm", "--out", out / "warmup", "--force"),
           env=env, stdout=subprocess.DEVNULL).wait(300):
        raise SystemExit("warm-up failed")
    sampler = MetricsSampler(url)
    sampler.start()
    try:
        if run(pin + latroute("loadgen", "--base-url", url, "--trace", workload, "--num-prompts", n, "--out", out / "client", "--force"),
               env=env, stdout=subprocess.DEVNULL).wait(1800):
            raise SystemExit("loadgen failed")
        time.sleep(2)  # the series' tail: the server drained
    finally:
        sampler.stop.set()
        sampler.join(5)
    import pandas as pd

    pd.DataFrame(sampler.rows).to_csv(out / "metrics.csv", index=False)


def real_run(out: Path, workload: Path, n: int, py: str, port: int, record: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": REAL_CORE}
    extra = []
    if record:
        env.update(PYTHONPATH=str(REPO), LATROUTE_RECORD_DIR=str(out / "rec"))
        extra = ["--scheduler-cls", "traces.vllm_recorder.scheduler.RecordingScheduler"]
    with open(out / "server.log", "w") as log:
        server = run(["taskset", "-c", REAL_CORE, py, "-m", "vllm.entrypoints.openai.api_server",
                      "--model", MODELS / "tiny-a", "--served-model-name", "tiny-a", "--load-format", "dummy",
                      "--dtype", "float32", "--enforce-eager", "--host", "127.0.0.1", "--port", port,
                      "--gpu-memory-utilization", "0.1", *ENGINE, "--no-enable-prefix-caching",
                      "--shutdown-timeout", "20", *extra], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", server, 300)
        drive(f"http://127.0.0.1:{port}", workload, out, n)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(90)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(30)
    if record:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        if run(latroute("trace", "import", "vllm-record", out / "rec", "--out", out / "rec.t", "--force"), env=env).wait(300):
            raise SystemExit("import failed")
        if run(latroute("trace", "join", out / "client", out / "rec", "--out", out / "join", "--force"),
               env=env, stdout=subprocess.DEVNULL).wait(300):
            raise SystemExit("join failed")


def calibrate(out: Path) -> None:
    """Profile and pool file from real1 alone."""
    from traces.store import open_trace

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(out / "calibrate.txt", "w") as log:
        if run(latroute("calibrate", out / "real1" / "rec.t", "--out", out / "tiny-a.json", "--force"),
               env=env, stdout=log).wait(900):
            raise SystemExit("calibrate failed")
    inst = open_trace(out / "real1" / "rec.t").read("instances").iloc[0]
    keep = ("max_num_batched_tokens", "max_num_seqs", "block_size", "num_kv_blocks", "max_model_len",
            "long_prefill_token_threshold")
    cfg = {k: int(inst[k]) for k in keep}
    pool = {"name": "tiny-a-real", "frontend_overhead_s": 0.0,
            "instances": [{"instance_id": "tiny-a", "model": "tiny-a", "profile": str(out / "tiny-a.json"),
                           "chunked_prefill": True, "prefix_caching": False, **cfg}]}
    (out / "pool.json").write_text(json.dumps(pool, indent=1))
    (out / "frontend.json").write_text(json.dumps(front_end(out), indent=1))


def front_end(out: Path) -> dict:
    """The front end's time on real1, two ways: the join's median API
    overhead (client TTFT - engine TTFT), and the constant that, added to
    the offline twin's TTFTs on real1's arrivals (``validate``, noise off),
    gives the lowest MAPE against real1's client TTFTs. The second also
    takes the real engine's hand-over (API process to engine core, on the
    same core) that the twin's step-boundary intake does not model."""
    import numpy as np
    import pandas as pd

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if run(latroute("validate", out / "real1" / "rec.t", "--profile", out / "tiny-a.json", "--out", out / "val-real1",
                    "--force"), env=env, stdout=subprocess.DEVNULL).wait(600):
        raise SystemExit("validate failed")
    v = pd.read_parquet(out / "val-real1" / "requests.parquet")
    j = pd.read_parquet(out / "real1" / "join" / "join.parquet")
    m = v.merge(j, left_on="request_id", right_on="recording_request_id")
    twin, client = m["ttft_twin_s"].to_numpy(), m["client_ttft_s"].to_numpy()
    grid = np.arange(0.0, 0.05, 1e-4)
    err = [float(np.mean(np.abs(twin + c - client) / client)) for c in grid]
    k = int(np.argmin(err))
    join_med = json.loads((out / "real1" / "join" / "join.json").read_text())["ttft_overhead"]["median_ms"] / 1e3
    return {"join_median_s": join_med, "fitted_s": float(grid[k]), "fitted_in_sample_mape_pct": err[k] * 100,
            "join_in_sample_mape_pct": float(np.mean(np.abs(twin + join_med - client) / client)) * 100,
            "twin_vs_real1_engine_mape_pct": float(np.mean(np.abs(twin - m["engine_ttft_s"]) / m["engine_ttft_s"])) * 100}


def serve_run(out: Path, root: Path, workload: Path, n: int, port: int, noise: str, frontend: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(out / "serve.txt", "w") as log:
        server = run(["taskset", "-c", REAL_CORE, *latroute(
            "serve", "--pool", root / "pool.json", "--port-base", port, "--noise", noise,
            "--frontend-overhead", f"{frontend:.6f}", "--record", out / "rec", "--force")],
            env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", server, 300)
        drive(f"http://127.0.0.1:{port}", workload, out, n)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(120)


def own_path_s(out: Path) -> float:
    """serve's own HTTP path: median client TTFT - recorded TTFT (the
    recording's TTFT already holds the --frontend-overhead wait)."""
    import numpy as np

    from traces.store import open_trace

    rec = open_trace(out / "rec").read("requests")[["client_id", "ttft_s"]]
    cl = open_trace(out / "client").read("requests")[["client_id", "ttft_s"]]
    m = rec.merge(cl, on="client_id", suffixes=("_rec", "_client"))
    return float(np.median(m["ttft_s_client"] - m["ttft_s_rec"]))


def ttfts(out: Path):
    from traces.store import open_trace

    r = open_trace(out / "client").read("requests")
    if "status" in r and (r["status"] != "ok").any():
        raise SystemExit(f"{out}: {(r['status'] != 'ok').sum()} failed requests")
    return r.set_index("request_id")["ttft_s"].sort_index()


def mape(pred, truth) -> float:
    import numpy as np

    p, t = pred.align(truth, join="inner")
    return float(np.mean(np.abs(p.to_numpy() - t.to_numpy()) / t.to_numpy()) * 100)


def read_series(out: Path):
    import pandas as pd

    return pd.read_csv(out / "metrics.csv")


def series_summary(out: Path) -> dict:
    m = read_series(out)
    return {c: {"mean": float(m[c].mean()), "p90": float(m[c].quantile(0.9)), "max": float(m[c].max())}
            for c in SERIES.values() if c in m}


def compare(out: Path) -> dict:
    import numpy as np

    runs = [r for r in ("real0", "real1", "real2", "real3", "serve-fo0", "serve-join", "serve") if (out / r / "client").is_dir()]
    t = {r: ttfts(out / r) for r in runs}
    res = {"requests": {r: int(len(v)) for r, v in t.items()},
           "ttft_median_ms": {r: float(v.median() * 1e3) for r, v in t.items()},
           "ttft_p90_ms": {r: float(v.quantile(0.9) * 1e3) for r, v in t.items()},
           "mape_pct": {}}
    for a in runs:
        for b in runs:
            if a != b and b.startswith("real") and "real0" not in (a, b):
                res["mape_pct"][f"{a} vs {b}"] = mape(t[a], t[b])
    join = out / "real1" / "join" / "join.json"
    if join.is_file():
        res["real1_api_overhead_ms"] = json.loads(join.read_text())["ttft_overhead"]
    if (out / "frontend.json").is_file():
        res["front_end"] = json.loads((out / "frontend.json").read_text())
    res["series"] = {r: series_summary(out / r) for r in runs if (out / r / "metrics.csv").is_file()}
    # per-second series side by side (serve against real2, real3 against real2): mean |difference|
    s = {r: read_series(out / r) for r in runs if (out / r / "metrics.csv").is_file()}
    if "real2" in s:
        n = min(len(v) for v in s.values())
        res["series_mean_abs_diff_vs_real2"] = {
            r: {c: float(np.mean(np.abs(s[r][c].to_numpy()[:n] - s["real2"][c].to_numpy()[:n])))
                for c in SERIES.values() if c in s[r]} for r in s if r != "real2"}
    return res


def series_table(out: Path, runs=("real2", "real3", "serve"), every: int = 5) -> str:
    """The /metrics series side by side (markdown), one row per ``every``
    seconds of sampling: running / waiting / KV usage (%) per run."""
    s = {r: read_series(out / r) for r in runs if (out / r / "metrics.csv").is_file()}
    n = min(len(v) for v in s.values())
    head = "| t (s) | " + " | ".join(f"{r} run / wait / KV %" for r in s) + " |"
    rows = [head, "|---|" + "---|" * len(s)]
    for i in range(0, n, every):
        cells = [f"{int(v['running'][i])} / {int(v['waiting'][i])} / {v['kv_usage'][i] * 100:.2f}" for v in s.values()]
        rows.append(f"| {i} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


STEPS = ("real0", "real1", "calibrate", "real2", "real3", "serve-fo0", "serve-join", "serve")


def study(out: Path, workload: Path | None, requests: int, vllm_python: str | None, port: int, noise: str,
          steps: tuple[str, ...]) -> None:
    """Run ``steps`` (none: only compare what ``out`` holds) and print the comparison and the series."""
    out = out.resolve()
    if steps:
        wl = workload.resolve()
        for k in (0, 1, 2, 3):
            if f"real{k}" in steps:
                real_run(out / f"real{k}", wl, requests, vllm_python, port, record=True)
            if k == 1 and "calibrate" in steps:
                calibrate(out)
        if "serve-fo0" in steps:
            serve_run(out / "serve-fo0", out, wl, requests, port + 100, noise, 0.0)
        fe = json.loads((out / "frontend.json").read_text())
        own = fe["serve_own_path_s"] = own_path_s(out / "serve-fo0")
        for name, key in (("serve-join", "join_median_s"), ("serve", "fitted_s")):
            fe[name] = max(0.0, fe[key] - own)
            print(f"{name}: front end {fe[key] * 1e3:.2f} ms ({key}), serve's own path {own * 1e3:.2f} ms: "
                  f"--frontend-overhead {fe[name] * 1e3:.2f} ms", flush=True)
        (out / "frontend.json").write_text(json.dumps(fe, indent=1))
        for name in ("serve-join", "serve"):
            if name in steps:
                serve_run(out / name, out, wl, requests, port + 100, noise, fe[name])
    print(json.dumps(compare(out), indent=1))
    print(series_table(out))
