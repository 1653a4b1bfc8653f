"""``latroute route``: a latroute router as an OpenAI-compatible proxy in front of vLLM backends."""
from __future__ import annotations

import math
from pathlib import Path

import click

from harness.cli.choices import DEFAULT_EPSILON, ROUTE_QUALITY_POLICIES, ROUTE_SLO_POLICIES
from harness.cli.extras import require_extra
from harness.cli.params import NON_NEGATIVE, POSITIVE, SEED, SPEED, Finite, IntIn, server_urls
from harness.cli.plugin_options import isolation_options
from harness.cli.replay_options import SLO_HELP, QualityPolicy, SloPolicy, ties_option
from traces.errors import BadOption

VIEWS = ("ledger", "metrics", "exact")
MODELS_TIMEOUT_S = 5.0


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit():
        raise BadOption("--listen", f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8200)")
    if not 1 <= int(port) <= 65535:
        raise BadOption("--listen", f"{text!r}: the port must be in 1-65535")
    return host, int(port)


def check_constant_length(text: str) -> None:
    """``--lengths constant:N``: N within the tokens one request may hold (``traces.datamodel.limits.MAX_TOKENS``);
    a 20-digit N once failed as an internal OverflowError."""
    from traces.datamodel.limits import MAX_TOKENS

    n = text[len("constant:"):] if text.startswith("constant:") else None
    if n is not None and not (n.isascii() and n.isdigit() and len(n) <= 9 and 1 <= int(n) <= MAX_TOKENS):
        raise BadOption("--lengths", f"constant:N takes N in [1, {MAX_TOKENS}], the most tokens a request may "
                                     f"hold (got {n[:20]}{'...' if len(n) > 20 else ''})")


def refuse_isolation(isolate: bool, timeout_s: float | None) -> None:
    """route takes the shared plug-in options only to refuse them by name:
    its router decides in the request path, on the proxy's event loop,
    where a round trip to a child process per decision (and a stuck
    plug-in, up to its timeout) would hold every client's request."""
    if isolate or timeout_s is not None:
        raise BadOption("--isolate-plugins" if isolate else "--plugin-timeout",
                        "route runs its router in the request path, on the proxy's event loop: a plug-in there "
                        "runs in-process (vet one with replay or sweep --isolate-plugins first)")


def check_router(name: str) -> None:
    from routers.registry import router_entry

    try:
        e = router_entry(name)
    except ValueError as err:
        raise BadOption("--router", str(err)) from None
    if e.estimator == "learned":  # LightGBM, the learned extra: refused now, not at the router's first fit
        require_extra(f"route --router {name}", "learned")
    if e.oracle:
        raise BadOption("--router", f"{name} is an oracle (it forks the twin's true future): no live proxy has one")
    if e.needs_baselines:
        raise BadOption("--router", f"{name}'s estimator needs baseline parameters measured on a calibration "
                                    "replay of the pool, which route does not take yet (sfs-* and the routers "
                                    "without an estimator run live)")


def _listed_models(urls: tuple[str, ...]) -> tuple[list[str], list[int | None]]:
    """Each bare backend's first /v1/models entry (model, max_model_len)."""
    import asyncio

    import aiohttp

    from harness.route.backends import listed_model

    async def one(session, url: str):
        try:
            return await listed_model(session, url, MODELS_TIMEOUT_S)
        except ValueError as e:
            raise BadOption("--backends", f"{url}/v1/models gave no model ({type(e).__name__}: {e}); give "
                                          "--pool with the backends' engines instead") from None

    async def all_() -> list:
        async with aiohttp.ClientSession() as s:
            return await asyncio.gather(*(one(s, u) for u in urls))

    got = asyncio.run(all_())
    return [g[0] for g in got], [g[1] for g in got]


@click.command()
@click.option("--backends", help="Backend server roots, comma-separated (vLLM or `latroute serve` instances).")
@click.option("--pool", "pool_ref",
              help="Pool name or POOL.json: the backends' engines, models, prices and profiles (instance k on "
                   "the k-th --backends URL), or entries with a \"url\" each (then no --backends).")
@click.option("--profile", help="With bare --backends (no --pool): every backend's batch-time profile; models "
                                "come from each backend's /v1/models, prices are 0.")
@click.option("--router", "router_name", required=True,
              help="A registry router (latroute list routers) or a plug-in module:Class.")
@click.option("--listen", required=True, help="HOST:PORT to serve on, e.g. 127.0.0.1:8200.")
@click.option("--view", type=click.Choice(VIEWS), default="ledger", show_default=True,
              help="What the router sees: ledger (the proxy's own record, engine state reconstructed with the "
                   "kernel), metrics (vLLM's /metrics polled, plus the ledger since), exact (the state each backend "
                   "publishes after every step: latroute serve's /latroute/state).")
@click.option("--poll-interval", "poll_ms", type=Finite(1.0, 3.6e6), default=100.0, show_default=True,
              help="--view metrics: milliseconds between polls of each backend's /metrics (the backends' "
                   "time, like every time under --speed).")
@click.option("--retry", is_flag=True,
              help="A request whose backend failed before it produced a token is routed once more, elsewhere.")
@click.option("--log", "log_dir", type=click.Path(path_type=Path),
              help="Write the decision log (a latroute trace: requests, decisions, instances) here at exit.")
@click.option("--force", is_flag=True, help="Replace --log if it exists.")
@click.option("--speed", type=SPEED, default=1.0, show_default=True,
              help="The backends' clock runs this many times faster than real time (latroute serve --speed, "
                   "0.001 to 1e6 in both): "
                   "the proxy's clock, SLOs and logged times are theirs.")
@click.option("--slo", "slo_policy", type=SloPolicy(ROUTE_SLO_POLICIES), default="rule", show_default=True,
              help="TTFT SLO of a request that states none (header x-latroute-slo-ttft-ms or llm-d's "
                   f"x-llm-d-slo-ttft-ms): replay's rule, {SLO_HELP}, or none.")
@click.option("--quality", "quality_policy", type=QualityPolicy(ROUTE_QUALITY_POLICIES),
              help="Predicted accuracy a request does not state (x-latroute-quality): the generator's accuracy "
                   "model (qwen3 models), refuse it (request), none (every accuracy 1), or FILE: your accuracy "
                   "per model, a CSV model,task,accuracy with a task * row for each backend's model "
                   "(docs/how-to/your-models.md). Default: model if it knows every backend's model, else none.")
@click.option("--lengths", "lengths_policy", default="max-tokens", show_default=True,
              metavar="max-tokens|median|constant:N",
              help="Predicted output length a request does not state (x-latroute-predicted-tokens); "
                   "constant:N with N in [1, 16777216], the most tokens a request may hold.")
@click.option("--lambda", "lam", type=NON_NEGATIVE, default=None, help="Cost weight of utility (default replay's).")
@click.option("--epsilon", type=Finite(0.0, 1.0, max_open=True), default=DEFAULT_EPSILON, show_default=True,
              help="Chance-constrained routers: allowed P(TTFT > SLO).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the SLO rule, quality model, "
                                                                      "seeded routers.")
@click.option("--capacity", type=IntIn(1, 10**8), default=200_000, show_default=True,
              help="Requests the proxy takes before it must be restarted (its router's arrays are this long).")
@click.option("--request-timeout", type=POSITIVE, default=600.0, show_default=True,
              help="Seconds a backend may stay silent in an answer before it counts as failed.")
@click.option("--log-estimates/--no-log-estimates", default=True, show_default=True,
              help="Log every backend's TTFT estimate for each request (routers with an estimator).")
@ties_option
@isolation_options
def route(backends: str | None, pool_ref: str | None, profile: str | None, router_name: str, listen: str,
          view: str, poll_ms: float, retry: bool, log_dir: Path | None, force: bool, speed: float,
          slo_policy: str, quality_policy: str, lengths_policy: str, lam: float | None, epsilon: float, seed: int,
          capacity: int, request_timeout: float, log_estimates: bool, ties: str, isolate_plugins: bool,
          plugin_timeout_s: float | None) -> None:
    """Route each request to a backend with a latroute router, as an OpenAI-compatible proxy.

    Serves /v1/completions and /v1/chat/completions (streamed or not),
    /v1/models, /health and its own /metrics. Each request is routed by the
    router on the view it asks for, forwarded with the backend's model name,
    and its answer streamed back unchanged. Every decision (each backend's
    residents, estimate and predicted utility, the choice) and every request
    (arrival, first token and finish as the proxy saw them) go to --log,
    written whole at SIGTERM or Ctrl-C. A backend that refuses connections,
    answers 5xx or breaks a stream is marked dead (logged) and routed around
    until its /health answers again.

    \b
    Examples:
      latroute serve --pool qwen3-h100 --port-base 8100 --speed 4 &
      B=http://127.0.0.1:8100,http://127.0.0.1:8101,http://127.0.0.1:8102
      latroute route --pool qwen3-h100 --backends $B --router sfs-cc --listen 127.0.0.1:8200 --speed 4 --log rl
      latroute route --pool my-pool-with-urls.json --router shortest-queue --view metrics --listen 127.0.0.1:8200
    """
    require_extra("route", "serve")  # before anything else: the proxy runs on aiohttp and prometheus_client
    refuse_isolation(isolate_plugins, plugin_timeout_s)
    host, port = parse_listen(listen)
    from harness.route.inputs import check_lengths_policy, check_quality_models

    check_constant_length(lengths_policy)
    try:
        check_lengths_policy(lengths_policy)
    except ValueError as e:
        raise BadOption("--lengths", str(e)) from None
    check_router(router_name)
    if log_dir is not None:
        from traces.files.outputs import check_out

        check_out(log_dir, force, option="--log")
    from harness.route.backends import listed_backends, pool_backends
    from harness.twin.pools.spec import load_pool

    urls = server_urls(backends, "--backends") if backends is not None else ()
    overhead, pool_name = 0.0, ""
    if pool_ref is not None:
        if profile is not None:
            raise BadOption("--profile", "give --pool (its profiles) or --profile with bare --backends, not both")
        pool = load_pool(pool_ref)
        bk = pool_backends(pool, urls)
        overhead, pool_name = pool.frontend_overhead_s, pool.name
    elif urls:
        if profile is None:
            raise BadOption("--backends", "bare --backends need --profile (or give --pool)")
        from estimators.timemodel.profile import load_profile

        try:
            load_profile(profile)
        except (ValueError, OSError) as e:
            raise BadOption("--profile", str(e)) from None
        models, lens = _listed_models(urls)
        bk = listed_backends(urls, models, lens, profile)
    else:
        raise BadOption("--backends", "give --backends URL,... or --pool POOL.json whose entries have urls")
    models = [b.model for b in bk]
    if quality_policy is None:  # the accuracy model where it knows every backend's model, else accuracy 1
        from traces.policies.quality import one_task_accuracy

        unknown = [m for m in models if m not in one_task_accuracy()]
        quality_policy = "none" if unknown else "model"
        click.echo(f"quality none (default: the accuracy model does not know {unknown[0]}): every model's accuracy "
                   "is 1, the utility 1 - lambda * cost" if unknown else
                   "quality model (default: the generator's accuracy model, requests as one task)")
    try:
        check_quality_models(quality_policy, models)
        from traces.policies.quality import fixed_accuracy

        fixed_accuracy(quality_policy, models)  # a quality file: read and checked against the backends' models
    except ValueError as e:
        raise BadOption("--quality", str(e)) from None
    from harness.route.inputs import InputPolicies
    from harness.route.proxy import RouteConfig
    from harness.route.server import route as run_route
    from routers.utility import DEFAULT_LAMBDA

    policies = InputPolicies(slo_policy, quality_policy, lengths_policy, DEFAULT_LAMBDA if lam is None else lam, seed)
    cfg = RouteConfig(backends=bk, router=router_name, port=port, host=host, view=view, poll_interval_ms=poll_ms,
                      retry=retry, log=log_dir, force=force, speed=speed, policies=policies, capacity=capacity,
                      epsilon=epsilon, overhead_s=overhead, request_timeout_s=request_timeout,
                      log_estimates=log_estimates, pool_name=pool_name, ties=ties)
    try:
        report = run_route(cfg, say=lambda line: click.echo(line))
    except OSError as e:
        click.echo(f"error: --listen: {e}", err=True)
        raise SystemExit(1) from None
    mean = report["mean_decision_us"]
    click.echo(f"route: {report['decisions']} decisions"
               + (f", mean {mean:.1f} us each" if not math.isnan(mean) else "")
               + f"; {report['events']} backend events")
    if log_dir is not None:
        click.echo(f"wrote {log_dir} ({report.get('requests', 0)} requests: "
                   + ", ".join(f"{report[k]} {k}" for k in ("ok", "error", "abandoned", "shed", "open")
                               if report.get(k)) + ")")
