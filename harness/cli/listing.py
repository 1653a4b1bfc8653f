"""``latroute list``: what is built in (pools, profiles, routers,
estimators), so a user never reads the source to find a name."""
from __future__ import annotations

import json

import click

KINDS = ("pools", "profiles", "routers", "estimators")


def list_rows(kind: str) -> list[tuple[str, str]]:
    """(name, one-line description) of every built-in of ``kind``."""
    if kind == "pools":
        from harness.twin.pools.spec import BUILTIN_POOLS

        rows = []
        for name, make in BUILTIN_POOLS.items():
            pool = make()
            n_rep = pool.notes.get("replicas", 1)
            shown = pool.instances[::n_rep]  # replicas of an entry sit together: one line part per model
            rows.append((name, ", ".join((f"{n_rep} x " if n_rep > 1 else "")
                                         + f"{i.model} ({i.gpus} GPU, profile {i.profile})" for i in shown)
                         + (f" ({len(pool.instances)} instances)" if n_rep > 1 else "")
                         + f"; front end {1e3 * pool.frontend_overhead_s:g} ms; prefix caching "
                         + ("on" if all(i.caching for i in pool.instances) else "off")))
        return rows
    if kind == "profiles":
        from estimators.timemodel.builtin_profiles import BUILTIN_PROFILES

        return [(name, f"{p['form']} form, {p['fitted_on'].get('source', '')}") for name, p in BUILTIN_PROFILES.items()]
    if kind == "routers":
        from routers.registry import REGISTRY

        def caps(e) -> str:
            flags = [f for f in ("uses_delta", "uses_lambda", "needs_baselines", "oracle", "seeded", "baseline")
                     if getattr(e, f)]
            return (f"; estimator {e.estimator}" if e.estimator else "") + (f" [{', '.join(flags)}]" if flags else "")

        return [(name, e.summary + caps(e)) for name, e in REGISTRY.items()]
    from estimators.estimate import KNOWN_ESTIMATORS
    from routers.registry import ESTIMATOR_NEEDS_BASELINES

    doc = {"sfs": "simulates the instance's scheduler forward from its honest state (the shared kernel)",
           "throughput": "outstanding prefill tokens / prefill rate + a decode step",
           "lps": "paper's LPS queueing formula, calibration mean arrival rate",
           "lps-mg": "M/G/k-style wait with an online EWMA arrival rate (rho held at 0.95)",
           "queue": "b0 + b1 * residents, fitted",
           "learned": "llm-d's online-trained LightGBM model (mean, p50, p90) on the view's features, trained "
                      "only on first tokens out before the query arrived; the learned extra; not in the default list"}
    return [(n, doc.get(n, "") + ("; needs baseline parameters" if ESTIMATOR_NEEDS_BASELINES.get(n) else ""))
            for n in KNOWN_ESTIMATORS]


@click.command("list")
@click.argument("kind", type=click.Choice(KINDS))
@click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON: [{name, description}].")
def list_(kind: str, as_json: bool) -> None:
    """List the built-in pools, profiles, routers or estimators.

    \b
    Examples:
      latroute list routers
      latroute list pools --json
    Plug-in routers are given by import path: --router mypkg.mod:MyRouter.
    """
    rows = list_rows(kind)
    if as_json:
        click.echo(json.dumps([{"name": n, "description": d} for n, d in rows], indent=2))
        return
    width = max(len(n) for n, _ in rows)
    for name, desc in rows:
        click.echo(f"{name:<{width}}  {desc}")
