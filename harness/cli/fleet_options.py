"""The options saying which fleet served a request log: ``--pool``,
``--replicas``, ``--assign`` and ``--assign-seeds``, shared by
``calibrate --from-requests``, ``validate`` and ``estimate``
(``harness.requestlevel.fleet`` holds what they mean). Light: the
commands' ``--help`` imports this module."""
from __future__ import annotations

from pathlib import Path

import click

from harness.cli.params import IntIn, given

ASSIGN_CHOICES = ("round-robin", "random", "least-requests")  # harness.requestlevel.fleet.ASSIGN (a test checks)
MAX_REPLICAS = 4096  # harness.requestlevel.fleet.MAX_REPLICAS (a test checks)
DEFAULT_SEEDS = 5
FLEET_PARAMS = {"fleet_pool": "--pool", "replicas": "--replicas", "assign": "--assign", "assign_seeds": "--assign-seeds"}


def fleet_options(f):
    """Add the fleet options to a command."""
    options = [
        click.option("--pool", "fleet_pool", type=click.Path(path_type=Path), metavar="FILE",
                     help="Request-level TRACE: a pool file (harness.twin.pools.spec) of one model's replicas that served "
                          "the log: their count and engine settings, and (validate, estimate) their profile and "
                          "front end."),
        click.option("--replicas", type=IntIn(1, MAX_REPLICAS),
                     help="Request-level TRACE: this many replicas of one model served the log (one profile, "
                          "shared)."),
        click.option("--assign", type=click.Choice(ASSIGN_CHOICES),
                     help="How the replicas shared the requests, where the log does not name each one's instance "
                          "(a Kubernetes Service: random with iptables, round-robin with IPVS; Envoy's and vLLM's "
                          "production-stack router's defaults: round-robin). A log that names them is replayed as "
                          "logged (round-robin is checked against it)."),
        click.option("--assign-seeds", type=IntIn(1, 1000), default=DEFAULT_SEEDS, show_default=True,
                     help="Seeds of --assign to fit and score under (min/median/max reported); round-robin over "
                          "identical replicas gives one assignment whatever its start."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def given_fleet_options(ctx: click.Context) -> set[str]:
    return {opt for param, opt in FLEET_PARAMS.items() if given(ctx, param)}
