"""``latroute serve``: a pool's instances as emulated vLLM servers, in real time."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import click

from harness.cli.extras import require_extra
from harness.cli.params import SEED, SPEED, Finite, IntIn
from traces.errors import BadOption


@click.command()
@click.option("--pool", "pool_ref", default="qwen3-h100", show_default=True, help="Pool name or POOL.json.")
@click.option("--profile", help="Batch-time profile (name or PROFILE.json) for every instance, instead of the pool's.")
@click.option("--port-base", type=IntIn(1024, 65535), required=True,
              help="Instance k of the pool listens on 127.0.0.1:PORT_BASE+k.")
@click.option("--noise", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="Step-time noise (the profiles' jitter and stalls, seeded); off: expected step times.")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the step-time noise.")
@click.option("--speed", type=SPEED, default=1.0, show_default=True,
              help="Run the clock this many times faster than real time (quick tests; below 1: slower), "
                   "0.001 to 1e6 as route --speed.")
@click.option("--stream-interval", type=IntIn(1, 1 << 20), default=1, show_default=True,
              help="Send streamed tokens in groups of this many (vLLM's --stream-interval; first and last at once).")
@click.option("--frontend-overhead", type=Finite(0.0, 3600.0), default=None,
              help="Seconds waited before a request's first token (default: the pool's frontend_overhead_s, which "
                   "the offline twin adds to every TTFT; this server's own HTTP path comes on top).")
@click.option("--record", type=click.Path(path_type=Path),
              help="Write every request and step as a latroute trace here at shutdown.")
@click.option("--force", is_flag=True, help="Replace --record if it exists.")
def serve(pool_ref: str, profile: str | None, port_base: int, noise: str, seed: int, speed: float,
          stream_interval: int, frontend_overhead: float | None, record: Path | None, force: bool) -> None:
    """Serve every instance of a pool as an emulated vLLM server on 127.0.0.1.

    The twin's kernel plans each step, the step lasts what the profile (and
    its noise) says, divided by --speed, and every token is delivered at the
    end of its step. Each instance serves vLLM's /v1/completions,
    /v1/chat/completions (SSE streaming or not), /v1/models, /health and
    /metrics (vLLM's Prometheus names). The emulated model never emits EOS:
    a request runs to max_tokens. With prefix caching on (pool qwen3-h100-pc),
    each prompt's full blocks get chained hash ids from its token ids, so
    requests sharing a prefix hit the twin's cache (usage's cached_tokens).
    Stops on SIGTERM or Ctrl-C: open streams
    end with an error event, --record is written, the lag report printed.

    \b
    Examples:
      latroute serve --pool qwen3-h100 --port-base 8100 --noise off --record served
      latroute serve --pool qwen3-h100-x8 --port-base 8100 --speed 4
      latroute serve --pool qwen3-h100-pc --port-base 8100 --noise off
    """
    require_extra("serve", "serve")  # before anything else: without aiohttp and prometheus_client nothing serves
    if record is not None:
        from traces.files.outputs import check_out  # pyarrow: only when a recording is asked for

        check_out(record, force, inputs=[pool_ref], option="--record")  # before any work
    from harness.twin.pools.spec import load_pool

    pool = load_pool(pool_ref)
    if profile is not None:
        pool = replace(pool, instances=tuple(replace(c, profile=profile) for c in pool.instances))
    if frontend_overhead is not None:
        pool = replace(pool, frontend_overhead_s=frontend_overhead)
    asy = [c.instance_id for c in pool.instances if c.async_scheduling]
    if asy:  # serve steps the synchronous loop in real time (harness.serve.engine); refused, not run wrongly
        raise BadOption("--pool", f"instance {asy[0]} has async_scheduling on: serve emulates the synchronous "
                                  "engine loop only (the offline twin replays async scheduling)")
    last = port_base + len(pool.instances) - 1
    if last > 65535:
        raise BadOption("--port-base", f"{len(pool.instances)} instances need ports {port_base}..{last}, above 65535")
    from harness.serve.server import ServeConfig
    from harness.serve.server import serve as run_serve

    cfg = ServeConfig(pool=pool, pool_ref=pool_ref, port_base=port_base, noise=noise == "on", seed=seed, speed=speed,
                      stream_interval=stream_interval, record=record, force=force)
    try:
        report = run_serve(cfg, say=lambda line: click.echo(line))
    except OSError as e:
        click.echo(f"error: --port-base: {e}", err=True)
        raise SystemExit(1) from None
    click.echo(f"serve lag: {report['step_ends']} step ends, p50 {report['p50_ms']:.2f} ms, "
               f"p99 {report['p99_ms']:.2f} ms, max {report['max_ms']:.2f} ms; "
               f"{report['overruns']} handled > 5 ms late; {report['requests']} requests in "
               f"{report['served_s']:.1f} twin s")
    if record is not None:
        click.echo(f"wrote {record}")
