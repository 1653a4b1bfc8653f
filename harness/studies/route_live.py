"""The live study (``latroute study route-live``): does the
twin rank routers as they rank on real backends? One workload goes open
loop (``latroute loadgen --route-fields``) through ``latroute route`` with
each router in turn, on the same backends, in a seeded random order per
repeat; then ``latroute replay`` predicts each router's figures on the
twin of the same pool; the report sets measured and predicted
OnTimeUtility, SLO attainment, TTFT and shares side by side, with Kendall's
tau between the two orders and 95% intervals from the repeats
(``harness.studies.rank_agreement``).

Two kinds of backends:

- ``real``: two real vLLM servers (vLLM's own interpreter, ``--vllm-python``)
  on 127.0.0.1, tiny-a and tiny-b of ``shared/models``, each pinned to one
  core (``taskset -c N``, ``VLLM_CPU_OMP_THREADS_BIND=N``),
  ``--gpu-memory-utilization 0.1``, prefix caching off, the recording
  scheduler on. Pool file ``docs/pools/tiny-ab.json`` (prices, engine
  settings, per-task accuracies in ``notes.accuracy``, profiles). With
  ``--calibrate`` a first start of the servers records a calibration workload (another
  seed, round robin straight to the servers), ``latroute calibrate`` fits
  each server's profile on it and the front end's time is the median of
  client TTFT - engine TTFT; the servers are then restarted for the study.
- ``serve``: ``latroute serve`` backends of a built-in pool (e.g.
  ``qwen3-h100-x8``) at ``--speed``; the paper's generated workload; each
  run on freshly started backends (noise seeded by repeat). ``--views``
  repeats the study per view (``exact``, ``ledger``, ``metrics:MS``), the
  twin's prediction for ``metrics:MS`` being replay's ``--view-interval MS``.
- ``backends``: servers already running, named by a pool file whose
  entries carry their ``url`` (``state_url`` for ``exact`` on real vLLM),
  prices and profiles calibrated on recordings of them; the workload is
  ``--trace`` (SLOs, predicted lengths, quality: ``trace generate``'s);
  the twin's prediction is ``replay`` on the same pool. Nothing is started.

Measured OnTimeUtility is scored as ``replay`` scores the twin
(``live_workload.measured_ontime``): realised accuracy - lambda * realised
cost of the backend the proxy chose (its decision log), on time when the
client's TTFT (loadgen) is within the request's SLO. Every wait is bounded;
every server is stopped at the end, on error too.

``latroute study route-live real OUT [--calibrate] ...``,
``... serve OUT --pool qwen3-h100-x8 --speed 0.5 ...``,
``... backends OUT --pool POOL.json --trace DIR ...``, ``... report OUT``.
"""
from __future__ import annotations

import json
import os
import resource
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pandas as pd

from harness.live.ports import free_port_base
from harness.live.processes import cpu_seconds, start_ready, stop
from harness.studies.live_servers import REPO, latroute_cmd, run_checked, send, start_real, warm_up
from harness.studies.route_live_report import engine_ttfts, report

POOL_FILE = REPO / "docs" / "pools" / "tiny-ab.json"
ROUTERS = ("round-robin", "shortest-queue", "latency-agnostic", "sfs-hard", "sfs-cc")


# --- workloads and pools ---------------------------------------------------------------------------------------------

def write_trace(requests: pd.DataFrame, quality: pd.DataFrame, out: Path, note: dict) -> Path:
    from traces.store import TraceWriter

    with TraceWriter(out, force=True) as w:
        w.meta["source"] = {"kind": "generated", "generator": "harness.studies.route_live", **note}
        w.write_table("requests", requests)
        w.write_table("quality", quality)
    return out


def wall_copy(trace: Path, speed: float, out: Path) -> Path:
    """The workload with arrivals in wall seconds (backends at ``speed``)."""
    from traces.store import open_trace

    t = open_trace(trace)
    req = t.read("requests")
    req["arrival_s"] = req["arrival_s"] / speed
    return write_trace(req, t.read("quality"), out, {"engine_time_trace": str(trace), "speed": speed})


def pool_with(pool_path: Path, out: Path, urls: list[str] | None, calib: dict | None = None,
              state_urls: list[str | None] | None = None) -> Path:
    """The pool file as the study uses it: absolute profile paths (the
    calibrated ones, KV blocks and front end when ``calib`` gives them), a
    url per entry (and a state feed url, for ``--view exact`` on real servers)."""
    doc = json.loads(pool_path.read_text())
    calib = calib or {}
    for k, inst in enumerate(doc["instances"]):
        inst.update(calib.get("engine", {}).get(inst["instance_id"], {}))
        prof = calib.get("profiles", {}).get(inst["instance_id"]) or inst["profile"]
        p = Path(prof)
        inst["profile"] = str(p if p.is_absolute() or not (REPO / p).is_file() else REPO / p)
        if urls:
            inst["url"] = urls[k]
        if state_urls and state_urls[k]:
            inst["state_url"] = state_urls[k]
    if calib.get("frontend_overhead_s") is not None:
        doc["frontend_overhead_s"] = round(float(calib["frontend_overhead_s"]), 6)
    out.write_text(json.dumps(doc, indent=1))
    return out


# --- calibration (real) ----------------------------------------------------------------------------------------------

def calibrate(python: str, pool_path: Path, trace: Path, out: Path) -> dict:
    """Record ``trace`` round robin on fresh servers, then ``fit``."""
    from harness.twin.pools.spec import load_pool

    names = [c.model for c in load_pool(pool_path).instances]
    with ExitStack() as stack:
        urls, session, _ = start_real(stack, python, names, out)
        warm_up(urls, session)
        # through a round-robin proxy, so that the front end measured below includes the proxy's path
        routerun_checked(pool_with(pool_path, out / "pool-route.json", urls), "round-robin", "ledger", 1.0, 0, trace, out)
    return fit(pool_path, session, out)


def fit(pool_path: Path, session: Path, out: Path) -> dict:
    """Each server's profile fitted on its recording (``latroute
    calibrate``), its KV blocks as vLLM sized them, and the front end:
    median(client TTFT - engine TTFT) over both servers' requests."""
    from harness.twin.pools.spec import load_pool
    from traces.store import open_trace

    profiles, engine, gaps = {}, {}, []
    client = open_trace(out / "client").read("requests")[["client_id", "ttft_s"]]
    for c in load_pool(pool_path).instances:
        rec, t = session / f"rec-{c.model}", out / f"{c.model}.t"
        if not t.is_dir():
            run_checked(latroute_cmd("trace", "import", "vllm-record", rec, "--out", t, "--force"), out, 600)
        prof = out / f"{c.model}.profile.json"
        if not prof.is_file():
            r = run_checked(latroute_cmd("calibrate", t, "--out", prof, "--force"), out, 1200)
            (out / f"calibrate-{c.model}.txt").write_text(r.stdout)
        profiles[c.instance_id] = str(prof)
        engine[c.instance_id] = {"num_kv_blocks": int(open_trace(t).read("instances").iloc[0]["num_kv_blocks"])}
        m = client.merge(engine_ttfts(rec), on="client_id", suffixes=("_client", "_engine"))
        gaps.append((m["ttft_s_client"] - m["ttft_s_engine"]).to_numpy())
    calib = {"profiles": profiles, "engine": engine, "frontend_overhead_s": float(np.median(np.concatenate(gaps))),
             "pairs": int(sum(len(g) for g in gaps))}
    (out / "calibration.json").write_text(json.dumps(calib, indent=1))
    return calib


# --- the runs --------------------------------------------------------------------------------------------------------

def run_order(routers: list[str], repeats: int, seed: int) -> list[tuple[int, str]]:
    """Each repeat runs every router once, in its own seeded random order."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x11fe]))
    return [(rep, routers[k]) for rep in range(repeats) for k in rng.permutation(len(routers))]


def routerun_checked(pool: Path, router: str, view: str, speed: float, seed: int, trace: Path, run_dir: Path,
              backends: list[str] | None = None, ties: str | None = None) -> dict:
    """One run; the CPU seconds the proxy and loadgen took from the
    machine the backends share (CPU contention, beside the wall time)."""
    kind, _, interval_ms = view.partition(":")
    port = free_port_base(1)
    args = ["route", "--pool", str(pool), "--router", router, "--listen", f"127.0.0.1:{port}", "--view", kind,
            "--quality", "request", "--speed", str(speed), "--seed", str(seed), "--log", str(run_dir / "log"),
            "--force", *(["--poll-interval", interval_ms] if interval_ms else []),
            *(["--backends", ",".join(backends)] if backends else []), *(["--ties", ties] if ties else [])]
    proxy = start_ready(args, run_dir)
    try:
        t0, c0, p0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN), cpu_seconds(proxy.pid)
        # each run's ids its own (X-Request-Id, which the recording keeps): the recording of a session splits by run
        send(["--base-url", f"http://127.0.0.1:{port}"], trace, run_dir / "client", run_dir,
             ["--route-fields", "--id-prefix", f"{run_dir.name}-r"])
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = {"wall_s": time.monotonic() - t0, "proxy_cpu_s": cpu_seconds(proxy.pid) - p0,
               "loadgen_cpu_s": c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime}
    finally:
        stop(proxy)
    return cpu


def measure(run_dir: Path, trace: Path, pool_ref: str, speed: float) -> dict:
    """One run's figures (``measured_ontime``) from its client trace (TTFT,
    in backend seconds) and decision log (the backend chosen)."""
    from harness.studies.live_workload import measured_ontime
    from harness.twin.pools.spec import load_pool
    from traces.store import open_trace

    pool = load_pool(pool_ref)
    t = open_trace(trace)
    req, qual = t.read("requests"), t.read("quality")
    client = open_trace(run_dir / "client").read("requests")[["request_id", "ttft_s", "client_id"]]
    log = open_trace(run_dir / "log").read("requests")[["client_id", "instance_id", "ttft_s"]]
    m = client.merge(log, on="client_id", how="left", suffixes=("", "_proxy"))
    served = pd.DataFrame({"request_id": m["request_id"], "instance_id": m["instance_id"],
                           "ttft_s": m["ttft_s"] * speed})
    cfg = pool.instances
    out = measured_ontime(req, qual, [c.model for c in cfg], [c.instance_id for c in cfg],
                          [c.price_in for c in cfg], [c.price_out for c in cfg], served)
    out["proxy_ttft_p50_s"] = float(m["ttft_s_proxy"].median())
    return out


def predict(pool: Path | str, router: str, trace: Path, out: Path, seeds: int, view: str = "ledger",
            ties: str | None = None) -> dict:
    """``latroute replay`` of the workload, ``seeds`` noise seeds: the mean
    of each figure (and the per-seed OnTimeUtility)."""
    _, _, interval_ms = view.partition(":")
    out.mkdir(parents=True, exist_ok=True)
    figs = []
    for s in range(seeds):
        d = out / f"seed{s}"
        run_checked(latroute_cmd("replay", "--pool", pool, "--trace", trace, "--router", router, "--seed", s, "--out", d,
                       "--force", *(["--view-interval", interval_ms] if interval_ms else []),
                       *(["--ties", ties] if ties else [])), out, 900)
        figs.append(json.loads((d / "metrics.json").read_text()))
    keys = ("ontime_utility", "slo_attainment", "ttft_p50_s", "ttft_p90_s")
    res = {k: float(np.mean([f[k] for f in figs])) for k in keys}
    res["ontime_utility_seeds"] = [f["ontime_utility"] for f in figs]
    res["share_by_instance"] = {k: float(np.mean([f["share_by_instance"][k] for f in figs]))
                                for k in figs[0]["share_by_instance"]}
    return res


def study(out: Path, pool: Path | str, pool_ref: str, routers: list[str], repeats: int, seed: int, trace: Path,
          send_trace: Path, speed: float, twin_seeds: int, view: str, backends_for, ties: str | None = None) -> None:
    """Every (repeat, router) run, then the twin's predictions; results in
    OUT/results.json (re-read by ``report``)."""
    res_path = out / "results.json"
    res = json.loads(res_path.read_text()) if res_path.is_file() else {"runs": [], "predicted": {}}
    done = {(r["repeat"], r["router"]) for r in res["runs"]}  # a study cut short resumes where it stopped
    for rep, router in run_order(routers, repeats, seed):
        if (rep, router) in done:
            continue
        run_dir = out / "runs" / f"{router}-{rep}"
        run_dir.mkdir(parents=True, exist_ok=True)
        load = os.getloadavg()[0]
        with ExitStack() as stack:
            urls = backends_for(stack, rep)
            cpu = routerun_checked(pool, router, view, speed, seed, send_trace, run_dir, urls, ties)
        row = {"router": router, "repeat": rep, "load_before": load, "load_after": os.getloadavg()[0], **cpu,
               **measure(run_dir, trace, pool_ref, speed)}
        print(json.dumps(row), flush=True)
        res["runs"].append(row)
        res_path.write_text(json.dumps(res, indent=1))
    for router in routers:
        res["predicted"][router] = predict(pool_ref, router, trace, out / "twin" / router, twin_seeds, view, ties)
    res_path.write_text(json.dumps(res, indent=1))


# --- entry points ----------------------------------------------------------------------------------------------------

def real_main(a) -> None:
    from harness.studies.live_workload import cpu_workload, task_accuracy
    from harness.twin.pools.spec import load_pool

    python = a.vllm_python or os.environ.get("LATROUTE_VLLM_PYTHON")
    if not python:
        raise SystemExit("error: name vLLM's interpreter (--vllm-python or LATROUTE_VLLM_PYTHON)")
    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = load_pool(a.pool)
    models = [c.model for c in base.instances]
    acc = task_accuracy(base.notes, models)

    def workload(seed: int, rate: float, name: str) -> Path:
        req, q = cpu_workload(a.requests, rate, seed, acc, a.slo_scale)
        return write_trace(req, q, out / name, {"rate": rate, "seed": seed, "slo_scale": a.slo_scale})

    calib = None
    if a.calibrate:
        calib = calibrate(python, a.pool, workload(a.seed + 1000, a.calibration_rate, "calibration-workload"),
                          out / "calibration")
        print(json.dumps(calib, indent=1), flush=True)
        if a.calibrate_only:
            return
    elif (out / "calibration" / "calibration.json").is_file():
        calib = json.loads((out / "calibration" / "calibration.json").read_text())
    twin_pool = pool_with(a.pool, out / "pool-twin.json", None, calib)
    trace = workload(a.seed, a.rate, "workload")
    title = (f"real vLLM (tiny-a, tiny-b), {a.requests} requests at {a.rate:g} q/s, SLO rule x {a.slo_scale:g}, "
             f"{a.repeats} repeats, view {a.view}, twin {a.twin_seeds} noise seeds")
    with ExitStack() as stack:
        urls, session, feeds = start_real(stack, python, models, out / "servers", feeds=a.view == "exact")
        warm_up(urls, session)
        route_pool = pool_with(a.pool, out / "pool-route.json", urls, calib, feeds)
        res_path = out / "results.json"
        if not res_path.is_file():
            res_path.write_text(json.dumps({"title": title, "runs": [], "predicted": {}}))
        study(out, route_pool, str(twin_pool), a.routers.split(","), a.repeats, a.seed, trace, trace, 1.0,
              a.twin_seeds, a.view, lambda stack_, rep: None, a.ties)
    print(report(out))


def serve_main(a) -> None:
    from harness.twin.pools.spec import load_pool

    out = a.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    n = len(load_pool(a.pool).instances)
    trace = out / "workload"
    run_checked(latroute_cmd("trace", "generate", "--requests", a.requests, "--rate", a.rate, "--seed", a.seed, "--out", trace,
                   "--force"), out, 600)
    wall = wall_copy(trace, a.speed, out / "workload-wall")

    def backends(stack: ExitStack, rep: int) -> list[str]:
        base = free_port_base(n)
        p = start_ready(["serve", "--pool", a.pool, "--port-base", str(base), "--speed", str(a.speed), "--seed",
                         str(a.seed + rep), "--stream-interval", str(a.stream_interval)], out)
        stack.callback(stop, p)
        return [f"http://127.0.0.1:{base + k}" for k in range(n)]

    for view in a.views.split(","):
        vout = out / view.replace(":", "-")
        vout.mkdir(parents=True, exist_ok=True)
        res_path = vout / "results.json"
        if not res_path.is_file():
            res_path.write_text(json.dumps({"title": f"latroute serve {a.pool} at --speed {a.speed:g} (stream interval "
                                                     f"{a.stream_interval}), {a.requests} requests at {a.rate:g} q/s "
                                                     f"(engine), view {view}",
                                            "runs": [], "predicted": {}}))
        study(vout, a.pool, a.pool, a.routers.split(","), a.repeats, a.seed, trace, wall, a.speed, a.twin_seeds,
              view, backends, a.ties)
        print(report(vout), flush=True)


def backends_main(a) -> None:
    """The study on servers that are already running (the pool's urls)."""
    from harness.route.backends import pool_backends
    from harness.twin.pools.spec import load_pool

    out, pool, trace = a.out.resolve(), a.pool.resolve(), a.trace.resolve()
    pool_backends(load_pool(pool))  # every entry names its server, before any run
    out.mkdir(parents=True, exist_ok=True)
    send_trace = trace if a.speed == 1.0 else wall_copy(trace, a.speed, out / "workload-wall")
    res_path = out / "results.json"
    if not res_path.is_file():
        res_path.write_text(json.dumps({"title": f"backends of {pool.name}, workload {trace.name}, {a.repeats} "
                                                 f"repeats, view {a.view}, speed {a.speed:g}",
                                        "runs": [], "predicted": {}}))
    study(out, pool, str(pool), a.routers.split(","), a.repeats, a.seed, trace, send_trace, a.speed, a.twin_seeds,
          a.view, lambda stack, rep: None, a.ties)
    print(report(out))
