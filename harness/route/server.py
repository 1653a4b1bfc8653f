"""``latroute route``'s process: the proxy bound on 127.0.0.1, until
SIGTERM or SIGINT.

Shutdown: the listening socket closes (no new requests), open requests get
``DRAIN_S`` wall seconds to end, the rest are cut (logged ``abandoned``),
then the decision log is written whole (``--log``) and a one-line summary
printed. A backend's death never stops the proxy: it is logged and routed
around (``harness.route.proxy``).
"""
from __future__ import annotations

import asyncio
import signal
import sys
import time

from harness.route.inputs import Stated
from harness.route.proxy import Proxy, RouteConfig
from harness.serve.clock import Clock
from harness.serve.server import warm

DRAIN_S = 2.0


async def _route(cfg: RouteConfig, say) -> dict:
    from aiohttp import web

    from harness.serve.app import Runner, quiet_refusals

    quiet_refusals()
    clock = Clock(speed=cfg.speed)
    proxy = Proxy(cfg, clock)
    runner = Runner(proxy.application(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port, reuse_address=True)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()
        raise OSError(f"port {cfg.port}: {err.strerror or err}") from None
    await proxy.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    health = asyncio.create_task(proxy.watch_health())
    say(f"routing with {cfg.router} ({cfg.view} view) over {len(cfg.backends)} backends on "
        f"http://{cfg.host}:{cfg.port}")
    for b in cfg.backends:
        say(f"  {b.instance_id} ({b.model}) at {b.url}")
    say("ready")
    await stop.wait()
    proxy.closing = True
    try:
        await site.stop()
        deadline = time.monotonic() + DRAIN_S
        while proxy.ledger.entries and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        health.cancel()
        await proxy.cut_open()  # their rows say abandoned
        await runner.cleanup()
        await proxy.stop()
    finally:  # whatever the shutdown met, the decision log is written
        report = _finish(cfg, proxy)
    return report


def _finish(cfg: RouteConfig, proxy: Proxy) -> dict:
    report = {"decisions": proxy.router.decisions, "mean_decision_us": proxy.router.mean_decision_us,
              "events": len(proxy.log.events), "shadow_early": proxy.ledger.early}
    if cfg.log is not None:
        meta = {"router": cfg.router, "view": cfg.view, "backends": [b.url for b in cfg.backends],
                "pool": cfg.pool_name, "speed": cfg.speed, "retry": cfg.retry,
                "poll_interval_ms": cfg.poll_interval_ms if cfg.view == "metrics" else None,
                "policies": cfg.policies.record(), "argv": sys.argv[1:]}
        report.update(proxy.log.write(cfg.log, cfg.force, meta))
    return report


def warm_router(cfg: RouteConfig) -> None:
    """One decision on a throwaway proxy (a request in flight on the first
    backend, another to route): the router's compiled code (SFS's kernels)
    is loaded before the first real request, which would otherwise wait
    for it (seconds, on a cold cache)."""
    p = Proxy(cfg, Clock(speed=cfg.speed))
    said = Stated(None, dict.fromkeys(p.book.models, 0.5), None)
    for k in range(2):
        i = p.book.take(64, 8, said)
        if k == 0:
            p.ledger.dispatched(0, i, 64, 8, p.clock.now())
            p.views.sent(0, i, 64, "warm")
    p.decide(i, 0, set())


def route(cfg: RouteConfig, say=print) -> dict:
    """Run until SIGTERM/SIGINT; returns the summary."""
    for b in cfg.backends[:1]:
        warm(b.spec)  # the kernel compiled before the first decision
    warm_router(cfg)
    return asyncio.run(_route(cfg, say))
