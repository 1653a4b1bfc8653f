"""``--isolate-plugins`` and ``--plugin-timeout``: where a plug-in runs.

A plug-in (a router or estimator named ``module:Class``) runs in
latroute's process by default, where any Python code can reach anything
the process holds, true output lengths included (through ``gc``, the
caller's frames, referrers). With ``--isolate-plugins`` it runs in a child
process of its own (``estimators.plugin_process``) that is sent only the
honest views, at the cost of a round trip per call; ``--plugin-timeout``
bounds each call there. Built-in routers and estimators are latroute's own
code and always run in-process.
"""
from __future__ import annotations

import click

from harness.cli.params import Finite

# mirrors estimators.plugin_process (kept free of numpy: --help imports this module)
DEFAULT_PLUGIN_TIMEOUT_S = 10.0
MAX_PLUGIN_TIMEOUT_S = 3600.0
PLUGIN_TIMEOUT = Finite(min=0.0, max=MAX_PLUGIN_TIMEOUT_S, min_open=True)


def isolation_options(f):
    f = click.option("--plugin-timeout", "plugin_timeout_s", type=PLUGIN_TIMEOUT, default=None,
                     help=f"With --isolate-plugins: the most seconds one call of a plug-in may take, in "
                          f"(0, {MAX_PLUGIN_TIMEOUT_S:g}]; one that takes longer is killed and named as the "
                          f"failure.  [default: {DEFAULT_PLUGIN_TIMEOUT_S:g}]")(f)
    return click.option("--isolate-plugins", is_flag=True,
                        help="Run plug-in routers and estimators (module:Class) each in a child process "
                             "that is sent only the honest views: in latroute's process a plug-in can reach "
                             "anything, the true output lengths included. Costs a round trip per call.")(f)


def plugin_timeout(isolate: bool, timeout_s: float | None) -> float | None:
    """The per-call limit the run's plug-ins get, None for in-process; ``--plugin-timeout`` alone is refused
    (it would be silently ignored)."""
    if timeout_s is not None and not isolate:
        from traces.errors import BadOption

        raise BadOption("--plugin-timeout", "applies with --isolate-plugins only")
    if not isolate:
        return None
    return DEFAULT_PLUGIN_TIMEOUT_S if timeout_s is None else float(timeout_s)
