"""``latroute serve``: every instance of a pool as its own emulated vLLM
server on 127.0.0.1 (port ``port_base + k`` for the pool's k-th instance),
one process, one event loop, one clock.

Shutdown (SIGTERM or SIGINT): the listening sockets close first (no new
connections), open streams get an error event and end, what is left in the
engines is aborted, then the recording is written whole and the lag report
printed: how late step ends were handed to the streams (wall clock), p50
and p99, and how many boundaries were handled more than
``harness.serve.engine.LATE_S`` late (the machine is too small for the pool
at that rate when they are many).
"""
from __future__ import annotations

import asyncio
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.serve.app import InstanceApp, Runner, ServerState, quiet_refusals
from harness.serve.clock import Clock
from harness.serve.engine import ServedEngine
from harness.serve.metrics import EngineMetrics
from harness.serve.prefix import pool_hash_block
from harness.twin.instance import InstanceSpec, TwinConfig
from harness.twin.pools.spec import Pool

HOST = "127.0.0.1"
DRAIN_S = 2.0  # wall seconds open handlers get to send their error event at shutdown


@dataclass(frozen=True)
class ServeConfig:
    pool: Pool
    pool_ref: str
    port_base: int
    noise: bool = True
    seed: int = 0
    speed: float = 1.0
    stream_interval: int = 1
    record: Path | None = None
    force: bool = False


def lag_report(engines: list[ServedEngine]) -> dict:
    lag = np.concatenate([np.frombuffer(e.lag, dtype=np.float64) for e in engines]) if engines else np.zeros(0)
    q = (lambda p: float(np.quantile(lag, p)) * 1e3) if lag.size else (lambda p: float("nan"))
    return {"step_ends": int(lag.size), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": q(1.0),
            "overruns": int(sum(e.overruns for e in engines))}


def warm(spec: InstanceSpec) -> None:
    """Compile (or load from Numba's cache) the kernel and the abort before
    the clock starts: a first request must not wait for the compiler."""
    eng = ServedEngine(0, spec, TwinConfig(noise=False, record_steps=False), Clock(speed=1e9))
    a = eng.submit("warm-a", 8, 2)
    eng.catch_up(np.inf)
    b = eng.submit("warm-b", 8, 2)
    eng.abort(b)
    del a


async def _serve(cfg: ServeConfig, specs: list[InstanceSpec], say) -> dict:
    from aiohttp import web

    quiet_refusals()
    hash_block = pool_hash_block([s.config.block_size for s in specs if s.config.caching])
    state = ServerState(speed=cfg.speed, overhead_s=cfg.pool.frontend_overhead_s, stream_interval=cfg.stream_interval,
                        hash_block=hash_block)
    clock = Clock(speed=cfg.speed)
    tcfg = TwinConfig(seed=cfg.seed, noise=cfg.noise, record_steps=cfg.record is not None)
    engines, runners, sites = [], [], []
    for k, spec in enumerate(specs):
        m = EngineMetrics(spec.model, spec.config.max_model_len)
        e = ServedEngine(k, spec, tcfg, clock, m, ids=state.ids, hash_block=hash_block)
        m.bind(e)
        engines.append(e)
        runner = Runner(InstanceApp(e, m, spec.model, state).application(), handler_cancellation=True,
                               access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, HOST, cfg.port_base + k, reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            for r in runners + [runner]:
                await r.cleanup()
            raise OSError(f"port {cfg.port_base + k} ({spec.instance_id}): {err.strerror or err}") from None
        runners.append(runner)
        sites.append(site)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    clock.origin = time.monotonic()  # t = 0: every instance listening
    tasks = [asyncio.create_task(e.run()) for e in engines]
    for task in tasks:  # an engine that fails stops the server (the error is raised after the shutdown)
        task.add_done_callback(lambda t: stop.set() if not t.cancelled() and t.exception() else None)
    for k, spec in enumerate(specs):
        say(f"serving {spec.instance_id} ({spec.model}) on http://{HOST}:{cfg.port_base + k}")
    say(f"ready: {len(specs)} instances of {cfg.pool.name}, noise {'on' if cfg.noise else 'off'}, "
        f"speed {cfg.speed:g}x")
    await stop.wait()
    state.closing = True
    for site in sites:
        await site.stop()
    for e in engines:
        for h in list(e.live.values()):
            h.queue.put_nowait(("error", "the server is shutting down", None))
    deadline = time.monotonic() + DRAIN_S
    while any(e.live for e in engines) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    for e in engines:
        for h in list(e.live.values()):
            e.abort(h)
        e.stop()
    await asyncio.gather(*tasks)
    for r in runners:
        await r.cleanup()
    report = lag_report(engines)
    report["requests"] = sum(len(e.requests) for e in engines)
    report["served_s"] = clock.now()
    if cfg.record is not None:
        from harness.serve.recording import write_recording

        meta = {"source": {"kind": "serve", "pool": cfg.pool_ref, "noise": cfg.noise, "seed": cfg.seed,
                           "speed": cfg.speed, "stream_interval": cfg.stream_interval, "argv": sys.argv[1:]},
                "serve": {"lag": report, "frontend_overhead_s": cfg.pool.frontend_overhead_s}}
        write_recording(cfg.record, engines, cfg.pool.frontend_overhead_s, meta, cfg.force, hash_block)
    return report


def serve(cfg: ServeConfig, say=print) -> dict:
    """Run until SIGTERM/SIGINT; returns the lag report."""
    specs = [InstanceSpec.from_config(c) for c in cfg.pool.instances]
    warm(specs[0])
    return asyncio.run(_serve(cfg, specs, say))
