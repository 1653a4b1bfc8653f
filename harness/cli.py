"""The ``latroute`` command line.

Every command refuses bad input the same way: one line
``error: FILE:ROW: COLUMN: reason`` on stderr and exit status 2, so CI jobs
and scripts can tell a bad trace from a failed check (exit 1).
"""
from __future__ import annotations

import importlib
import sys

import click

from traces.errors import BadInput


class LatrouteGroup(click.Group):
    """A click group that turns BadInput into the one-line error and exit 2,
    keeps the command line for the results' headers, and imports a command's
    module only when that command runs (its help line comes from COMMANDS)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module_name, attr = COMMANDS[cmd_name][0].split(":")
            cmd = getattr(importlib.import_module(module_name), attr)
            add_vllm_aliases(cmd)
            self.add_command(cmd, cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1] if name in COMMANDS else self.commands[name].get_short_help_str())
                for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def make_context(self, info_name, args, parent=None, **extra):
        argv = list(args)
        ctx = super().make_context(info_name, args, parent, **extra)
        ctx.meta["latroute.argv"] = argv
        return ctx

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
      latroute demo                                    # the whole story
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


# vLLM's (``vllm bench serve``) names for the same things, accepted beside
# latroute's own on every command that has the latroute option.
VLLM_ALIASES: dict[str, str] = {
    "--rate": "--request-rate",
    "--requests": "--num-prompts",
    "--out": "--result-dir",
    "--seeds": "--num-seeds",
}


def add_vllm_aliases(cmd: click.Command) -> None:
    """Give every option named in VLLM_ALIASES its vLLM spelling too (once;
    not where the command already has an option of that name)."""
    for sub in getattr(cmd, "commands", {}).values():
        add_vllm_aliases(sub)
    taken = {o for p in cmd.params for o in getattr(p, "opts", [])}
    for p in cmd.params:
        for opt, alias in VLLM_ALIASES.items():
            if isinstance(p, click.Option) and opt in p.opts and alias not in taken:
                p.opts.append(alias)
                taken.add(alias)


# Commands by import path, imported only when invoked (``latroute --help``
# must not pay for numba, pandas or matplotlib). name: ("module:attr", one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "trace": ("harness.cli_trace:trace", "Generate, import, inspect and query traces (Parquet + DuckDB)."),
    "demo": ("harness.cli_demo:demo", "Run the pipeline on built-in defaults and say where the results are."),
    "bench": ("harness.cli_bench:bench", "Measure speed and memory of latroute's heavy paths."),
    "calibrate": ("harness.cli_calibrate:calibrate", "Fit a batch-time profile from the steps of traces."),
    "validate": ("harness.cli_validate:validate", "Replay a recorded trace on the engine twin and compare with vLLM."),
    "estimate": ("harness.cli_estimate:estimate", "Estimate every measured request's TTFT with each estimator."),
    "replay": ("harness.cli_replay:replay", "Replay a workload through one router on the engine twin of a pool."),
    "sweep": ("harness.cli_replay:sweep", "Replay routers over arrival rates (and deltas, lambdas, seeds)."),
    "report": ("harness.cli_report:report", "Build an HTML and Markdown report from results."),
    "list": ("harness.cli_list:list_", "List the built-in pools, profiles, routers or estimators."),
    "check": ("harness.cli_report:check", "Regression gate for CI: compare a result's metrics with a baseline."),
    "record": ("harness.cli_record:record", "Record a real vLLM engine's every step (in vLLM's own environment)."),
    "loadgen": ("harness.cli_loadgen:loadgen", "Open-loop streaming load on an OpenAI-compatible endpoint."),
}


def main() -> None:
    cli(prog_name="latroute")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
