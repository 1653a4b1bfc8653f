"""Options and checks that ``replay`` and ``sweep`` share: the policies that fill
what a trace lacks, the stale view, the arrival process, router names."""
from __future__ import annotations

import click

from harness.cli.choices import (
    ARRIVAL_KINDS,
    DEFAULT_EPSILON,
    DEFAULT_TIES,
    LEARNED_MIN_SAMPLES,
    LEARNED_RETRAIN_EVERY_S,
    LEARNED_WINDOW,
    LENGTH_POLICIES,
    QUALITY_POLICIES,
    SLO_POLICIES,
    TIE_POLICIES,
)
from harness.cli.extras import install_command
from harness.cli.params import (
    AT_LEAST_1,
    BURSTINESS,
    NON_NEGATIVE,
    PROBABILITY_BELOW_1,
    IntIn,
)
from traces.errors import BadOption

# The router registry, the arrival generators and the length policies load numpy, pandas and numba: they are
# imported by the checks below, when a command runs, never by its --help (harness.cli.choices holds the names).


def learned_available() -> bool:
    """Whether LightGBM (the learned extra) can be imported here."""
    from estimators.learned.model import available

    return available()


def parse_routers(text: str) -> list[str]:
    from routers.registry import router_entry

    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise click.BadParameter("no router given", param_hint="--router(s)")
    for n in names:  # built-in names, or plug-ins as module:Class (routers.registry.plugin_entry)
        try:
            e = router_entry(n)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--router(s)") from None
        if e.estimator == "learned" and not learned_available():  # refused before any work, not at its first fit
            raise click.BadParameter(f"{n} needs LightGBM (the learned extra): {install_command('learned')}",
                                     param_hint="--router(s)")
    return names



class SloPolicy(click.ParamType):
    """--slo: a policy of ``traces.policies.slo``, checked while the command line is
    parsed (constant:MS a finite number in (0, 1e9]); ``allowed``: the
    policies the command takes."""

    name = "slo"

    def __init__(self, allowed: tuple[str, ...] = SLO_POLICIES) -> None:
        self.allowed = allowed

    def convert(self, value, param, ctx):
        from traces.policies.slo import check_slo_policy

        try:
            check_slo_policy(value, self.allowed)
        except ValueError as e:
            self.fail(str(e), param, ctx)
        return value

    def get_metavar(self, param, ctx=None) -> str:
        return "|".join(self.allowed)


SLO_HELP = ("constant:MS = MS milliseconds for every request (e.g. constant:500: the paper's rule asks 150-1120 ms, "
            "which a pool whose TTFTs are seconds never meets)")


class QualityPolicy(click.ParamType):
    """--quality: a policy by name, or a quality file (which must exist;
    its content is checked against the pool before any work)."""

    name = "quality"

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def convert(self, value, param, ctx):
        import os

        if value in self.names or os.path.lexists(value):
            return value
        self.fail(f"{value!r} is neither a policy ({', '.join(self.names)}) nor a file", param, ctx)

    def get_metavar(self, param, ctx=None) -> str:
        return "|".join(self.names) + "|FILE"


QUALITY_FILE_HELP = ("FILE: your accuracy per model and task, a CSV model,task,accuracy naming exactly the pool's "
                     "models (docs/how-to/your-models.md)")


def check_quality_option(policy: str | None, models: list[str]) -> None:
    """A quality file, read and checked against the pool's models before
    any work (``BadInput`` names the file, line and model)."""
    from traces.policies.quality import is_quality_file, quality_file

    if is_quality_file(policy):
        quality_file(policy, models)


def policy_options(f):
    """--lengths, --slo and --quality: what routers are told where a trace
    lacks it (shared by replay and sweep)."""
    f = click.option("--quality", "quality_policy", type=QualityPolicy(QUALITY_POLICIES[:3]),
                     help="Per-model accuracy: the trace's quality table, the generator's accuracy model with "
                          "the requests as one task (qwen3 models), none (every accuracy 1: the utility is "
                          f"1 - lambda * cost), or {QUALITY_FILE_HELP}. Default: table if the trace has one for "
                          "the pool's models, else model if it knows them, else none.")(f)
    f = click.option("--slo", "slo_policy", type=SloPolicy(),
                     help="TTFT SLOs: the trace's slo_ttft_s (column), the paper's SLO rule on the prompt length, "
                          f"{SLO_HELP}, or none (every served request on time). Default: column if present, "
                          "else rule.")(f)
    f = click.option("--lengths", "lengths_policy", metavar="|".join(LENGTH_POLICIES),
                     help="Predicted output lengths routers see. Default: column (predicted_output_tokens) if "
                          "present, else median (of the trace's output lengths). oracle = true lengths.")(f)
    return f


def view_options(f):
    """--epsilon, --view-interval, --ledger (replay and sweep)."""
    f = click.option("--ledger", type=click.Choice(["on", "off"]), default="on", show_default=True,
                     help="With --view-interval: requests dispatched since the last refresh join the stale view.")(f)
    f = click.option("--view-interval", "view_interval_ms", type=NON_NEGATIVE, default=0.0, show_default=True,
                     help="Routers see engine state refreshed every MS milliseconds (0: every step, live). "
                          "The oracle always forks the live twin.")(f)
    return click.option("--epsilon", type=PROBABILITY_BELOW_1, default=DEFAULT_EPSILON, show_default=True,
                        help="Chance-constrained routers (sfs-cc, throughput-cc): allowed P(TTFT > SLO), one "
                             "value for every rate. On qwen3-h100 (Poisson 3-9 q/s) sfs-cc's AUC is flat from 0.02 "
                             "to 0.3, within the seed spread; 0.1 sits in the middle of it.")(f)


def learned_options(f):
    """--retrain-every and --window (replay and sweep): the learned routers' online training schedule."""
    f = click.option("--window", type=IntIn(LEARNED_MIN_SAMPLES, 1_000_000), default=LEARNED_WINDOW, show_default=True,
                     help="Learned routers: the newest labelled samples each fit uses (llm-d's example "
                          "deployment: 100).")(f)
    return click.option("--retrain-every", "retrain_every_s", type=NON_NEGATIVE, default=LEARNED_RETRAIN_EVERY_S,
                        show_default=True,
                        help="Learned routers: simulated seconds between fits (llm-d's example deployment retrains "
                             "every second; its code's default is 1800). Only first tokens out before an arrival "
                             "teach. Each fit costs ~20 ms of wall time: at 600 a learned router's sweep cells "
                             "cost ~2x sfs-cc's, at 1 about 30x (docs/results/learned-routing.md).")(f)


def ties_option(f):
    """--ties (replay, sweep, route): the replica two-level routers pick among a model's."""
    return click.option("--ties", type=click.Choice(TIE_POLICIES), default=DEFAULT_TIES, show_default=True,
                        help="Latency-aware and chance routers on pools with replicas: the model by predicted "
                             "utility, then its replica: random (uniform among those meeting the SLO, seeded by "
                             "--seed), least-latency (the lowest estimated TTFT; cc: the highest P(on time)) or "
                             "lowest-index (the first meeting the SLO: the one-level rule's results). One "
                             "instance per model: all the same.")(f)


def arrival_options(f):
    f = click.option("--burstiness", type=BURSTINESS, default=1.0, show_default=True,
                     help="Gamma shape: inter-arrival CV^2 = 1/burstiness (vllm bench serve's meaning), in [0.01, "
                          "100]; other than 1 implies --arrival gamma.")(f)
    f = click.option("--burst-ratio", type=AT_LEAST_1, default=3.0, show_default=True, help="mmpp: high/low rate ratio.")(f)
    f = click.option("--arrival", type=click.Choice(ARRIVAL_KINDS),
                     help="Arrival process of generated workloads. Default: poisson, or gamma when --burstiness "
                          "is not 1.")(f)
    return f


def arrival_kind(arrival: str | None, burstiness: float) -> str:
    from traces.workload.arrivals import resolve_arrival

    try:
        return resolve_arrival(arrival, burstiness)
    except ValueError as e:
        raise BadOption("--burstiness", str(e)) from None


def check_lengths_option(text: str | None) -> None:
    from traces.policies.lengths import check_length_policy

    try:
        check_length_policy(text)
    except ValueError as e:
        raise BadOption("--lengths", str(e)) from None


def echo_policies(inputs) -> None:
    """Say which policies filled what the trace lacks (oracle lengths
    loudly, on stderr too)."""
    for note in inputs.notes():
        click.echo(note)
    if inputs.lengths.oracle:
        click.echo(inputs.lengths.note, err=True)
