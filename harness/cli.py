"""The ``latroute`` command line.

Every command refuses bad input the same way: one line
``error: FILE:ROW: COLUMN: reason`` on stderr and exit status 2, so CI jobs
and scripts can tell a bad trace from a failed check (exit 1).
"""
from __future__ import annotations

import sys

import click

from traces.errors import BadInput


class LatrouteGroup(click.Group):
    """A click group that turns BadInput into the one-line error and exit 2."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BadInput as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(2)


@click.group(cls=LatrouteGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="latroute")
def cli() -> None:
    """latroute: replay vLLM traces through TTFT estimators and routers.

    \b
    Start here:
      latroute demo                                    # the whole story, ~15 s
      latroute trace import azure AzureLLMInferenceTrace_conv.csv --out azconv
      latroute trace info azconv
      latroute trace import vllm-record RECORDING_DIR --out d1
      latroute calibrate d1 --out d1.json              # batch-time model from recorded steps
      latroute validate d1 --profile d1.json --out val # does the twin reproduce vLLM?
      latroute estimate d1 --calibrate-on d2 --out est # SFS vs baselines against measured TTFT
      latroute sweep --rates 4,6,8 --out sweep         # routers on pool qwen3-h100
      latroute report est sweep --out report           # report/index.html
      latroute check est --baseline ci/est.json        # CI regression gate
    """


def _register() -> None:
    from harness.cli_bench import bench
    from harness.cli_calibrate import calibrate
    from harness.cli_demo import demo
    from harness.cli_estimate import estimate
    from harness.cli_join import join
    from harness.cli_loadgen import loadgen
    from harness.cli_record import record
    from harness.cli_replay import replay, sweep
    from harness.cli_report import check, report
    from harness.cli_trace import trace
    from harness.cli_validate import validate

    trace.add_command(join)
    cli.add_command(trace)
    cli.add_command(demo)
    cli.add_command(bench)
    cli.add_command(calibrate)
    cli.add_command(validate)
    cli.add_command(estimate)
    cli.add_command(replay)
    cli.add_command(sweep)
    cli.add_command(report)
    cli.add_command(check)
    cli.add_command(record)
    cli.add_command(loadgen)


_register()


def main() -> None:
    cli(prog_name="latroute")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
