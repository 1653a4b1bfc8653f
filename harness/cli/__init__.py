"""The ``latroute`` command line, and its one error path.

This room holds one module per command (``trace``, ``replay`` and ``sweep``,
``estimate``, ...), the click parameter types (``params``) and the options
that several commands share; a command module may import anything in
latroute, nothing imports the command line but its own modules and tests.
A command module imports only click, the standard library and light
latroute modules at its top (its option choices from ``choices``), and
numba, numpy, pandas, duckdb and the rest inside the command, so every
``latroute CMD --help`` answers as fast as ``latroute --help``
(tests/harness/cli/test_cli_help.py).

Every command ends in one of four ways, so CI jobs and scripts can tell
them apart from the status alone:

- success, or a failed check or run that the command reports itself: exit
  0 or 1 (``check`` found a regression, ``loadgen`` had failed requests);
- bad input: one line ``error: FILE:ROW: COLUMN: reason`` (``BadInput``),
  ``error: OPTION: reason`` (``BadOption``), ``error: latroute CMD needs
  the EXTRA extra: python -m pip install -e ".[EXTRA]"`` (an optional extra
  the command needs is not installed: ``harness.cli.extras``) or, for what
  click finds while parsing the command line, ``error: latroute CMD:
  --opt: reason``; exit 2;
- an internal error (a bug, or the environment failing under us): one line
  ``error: internal error: Type: message (run with --debug ...)``, exit 1;
  ``latroute --debug CMD`` or ``LATROUTE_DEBUG=1`` prints the traceback too;
- Ctrl-C: one line ``interrupted``, exit 130 (128 + SIGINT, as shells do);
  SIGTERM is handled the same way (outputs being written are cleaned up:
  their temporaries removed as the exception unwinds), one line
  ``terminated``, exit 143 (128 + SIGTERM).

Every error line is made printable first: newlines folded, and text that
came from non-UTF-8 paths (surrogate escapes) shown as ``\\xNN``, so
printing the error can never itself fail.
"""
from __future__ import annotations  # noqa: I001 (harness.cli.signals first, on purpose)

# first, before click and the rest: Ctrl-C while they import is one line, not a traceback
from harness.cli.signals import _handle_sigterm, _signum, _watch_sigint, keep_exit_status, sigint_seen
from harness.cli.signals import Terminated as Terminated

import os
import re
import signal
import sys
import traceback
from collections.abc import Callable

import click

from traces.errors import BadInput

# Exit statuses: 1 = a failed check/run or an internal error, 2 = bad input, 130 = interrupted (SIGINT),
# 143 = terminated (SIGTERM).
EXIT_INTERNAL, EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 130, 143


class _Interrupted(Exception):
    """Ctrl-C (or SIGTERM) seen inside a command: raised past click, which
    would print a blank line and ``Aborted!`` for a KeyboardInterrupt."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__()
        self.signum = signum


_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())
_BREAKS = re.compile(r"[ ]*[\r\n\t\v\f\x1c-\x1e\x85\u2028\u2029]+[ ]*")


def printable(text: object) -> str:
    """``text`` on one line, encodable whatever the terminal: newlines folded
    to spaces; surrogate escapes (bytes of a non-UTF-8 path or argument)
    shown as ``\\xNN``."""
    line = _BREAKS.sub(" ", str(text)).strip()
    try:
        raw = line.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that is not an escaped byte
        raw = line.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")


def _param_hint(e: click.BadParameter) -> str:
    """The option as the user knows it: ``--rate``, not ``'--rate' / '--request-rate'``."""
    hint = e.param_hint
    if isinstance(hint, (list, tuple)):
        return "/".join(hint)
    if hint:
        return str(hint)
    if isinstance(e.param, click.Option) and e.param.opts:
        return e.param.opts[0]
    if e.param is not None:
        return e.param.human_readable_name
    return "value"


def click_error_line(e: click.ClickException) -> str:
    """One line for an error click raised while parsing (or a command raised
    as a click error): the command, the option, the reason."""
    ctx = getattr(e, "ctx", None)
    where = ctx.command_path if ctx is not None else "latroute"
    if isinstance(e, _NO_ARGS_IS_HELP):  # click >= 8.2 raises the whole help text as the "error"
        reason = f"missing command (see {where} --help)"
    elif isinstance(e, click.BadParameter) and not isinstance(e, click.MissingParameter):
        reason = f"{_param_hint(e)}: {e.message}"
    else:
        reason = e.format_message()
    reason = printable(reason).rstrip(".")
    return f"error: {where}: {reason}" if isinstance(e, click.UsageError) else f"error: {reason}"


def _debug_requested(args: list[str]) -> bool:
    """``--debug`` among the group's options (before the command name), or
    LATROUTE_DEBUG set to anything but 0/empty. Read from the arguments, not
    the parsed context, so it also holds for errors raised while parsing."""
    if os.environ.get("LATROUTE_DEBUG", "").strip().lower() not in ("", "0", "false", "no", "off"):
        return True
    for a in args:
        if not a.startswith("-"):
            return False
        if a == "--debug":
            return True
    return False


def _say(line: str) -> None:
    click.echo(printable(line), err=True)


def _tolerate_undecodable_output() -> None:
    """Let stdout carry non-UTF-8 paths back as the bytes they were
    (``wrote PATH`` must not fail after the output is written)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="surrogateescape" if stream is sys.stdout else "backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass


def _interrupted(signum: int) -> int:
    if signum == signal.SIGTERM:
        _say("terminated")
        return EXIT_TERMINATED
    _say("interrupted")
    return EXIT_INTERRUPTED


def _failed(e: Exception, debug: bool) -> int:
    """The line and status for a command's error: bad input (2), a click
    error (its own status), or an internal error (1, the one place they end)."""
    if isinstance(e, BadInput):
        _say(f"error: {e}")
        return EXIT_BAD_INPUT
    if isinstance(e, click.ClickException):
        _say(click_error_line(e))
        return EXIT_BAD_INPUT if isinstance(e, click.UsageError) else e.exit_code
    if debug:
        click.echo(traceback.format_exc(), err=True, nl=False)
    _say(f"error: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)")
    return EXIT_INTERNAL


class LatrouteGroup(click.Group):
    """A click group that runs every command through the one error path
    (``main``: one line, exit 2 / 1 / 130), keeps the command line for the results' headers, and imports a command's
    module only when that command runs (its help line comes from COMMANDS)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(COMMANDS))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            cmd = COMMANDS[cmd_name][0]()
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
        except KeyboardInterrupt as e:
            raise _Interrupted(_signum(e)) from None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode: bool = True, **extra):
        """Run a command through the one error path (see the module
        docstring) and exit with its status. ``standalone_mode=False`` is
        click's library mode: exceptions pass through untouched."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        argv = sys.argv[1:] if args is None else [str(a) for a in args]
        _tolerate_undecodable_output()
        try:
            status = self._run(argv, prog_name or "latroute", complete_var, **extra)
        except SystemExit as e:  # a command that ends itself (sweep's "interrupted: N of M cells ...")
            status = e.code
        if status == EXIT_INTERRUPTED:
            keep_exit_status()
        sys.exit(status)

    def _run(self, argv: list[str], prog_name: str, complete_var, **extra) -> int:
        debug = _debug_requested(argv)
        watching = _watch_sigint()  # from here on Ctrl-C unwinds (outputs cleaned)
        restore = _handle_sigterm()
        try:
            rv = super().main(argv, prog_name, complete_var, False, **extra)
        except (_Interrupted, KeyboardInterrupt, click.Abort) as e:
            return _interrupted(_signum(e))
        except Exception as e:
            if sigint_seen():  # Ctrl-C that a library swallowed, then failed on: still an interruption
                return _interrupted(signal.SIGINT)
            return _failed(e, debug)
        finally:
            restore()
            watching()
        # library mode returns ctx.exit(N)'s N, or the command's value (None for every latroute command)
        return rv if type(rv) is int else 0


@click.group("latroute", cls=LatrouteGroup,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="latroute")
@click.option("--debug", is_flag=True,
              help="Print the traceback of an internal error (also LATROUTE_DEBUG=1).")
def cli(debug: bool) -> None:
    """latroute: replay vLLM traces through TTFT estimators and routers.

    \b
    Start here (from the clone's root, the shared data beside it; the README
    walks through the same steps):
      latroute demo                                    # the whole story
      latroute trace import azure ../shared/data/azure_llm_2023/AzureLLMInferenceTrace_conv.csv --out azconv
      latroute trace info azconv
      latroute trace import vllm-record ../shared/data/vllm_cpu/d1_tinya_poisson_r3 --out d1
      latroute trace import vllm-record ../shared/data/vllm_cpu/d2_tinya_poisson_r5 --out d2
      latroute calibrate d1 --out d1.json              # batch-time model from recorded steps
      latroute validate d1 --profile d1.json --out val # does the twin reproduce vLLM?
      latroute estimate d1 --calibrate-on d2 --out est # SFS vs baselines against measured TTFT
      latroute sweep --rates 4,6,8 --requests 1000 --out sweep   # routers on pool qwen3-h100
      latroute report est sweep --out report           # report/index.html
      latroute check est --baseline ci/est.json --write-baseline   # once: the CI gate's baseline
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


# Each command is imported only when invoked (``latroute --help`` must not pay
# for numba, pandas or matplotlib), by a loader whose import is literal so that
# the layering contracts (lint-imports) see it. name: (loader, one-line help).


def _trace() -> click.Command:
    from harness.cli.trace import trace

    return trace


def _demo() -> click.Command:
    from harness.cli.demo import demo

    return demo


def _bench() -> click.Command:
    from harness.cli.bench import bench

    return bench


def _calibrate() -> click.Command:
    from harness.cli.calibrate import calibrate

    return calibrate


def _validate() -> click.Command:
    from harness.cli.validate import validate

    return validate


def _estimate() -> click.Command:
    from harness.cli.estimate import estimate

    return estimate


def _replay() -> click.Command:
    from harness.cli.replay import replay

    return replay


def _sweep() -> click.Command:
    from harness.cli.sweep import sweep

    return sweep


def _report() -> click.Command:
    from harness.cli.report import report

    return report


def _list() -> click.Command:
    from harness.cli.listing import list_

    return list_


def _check() -> click.Command:
    from harness.cli.report import check

    return check


def _record() -> click.Command:
    from harness.cli.record import record

    return record


def _loadgen() -> click.Command:
    from harness.cli.loadgen import loadgen

    return loadgen


def _serve() -> click.Command:
    from harness.cli.serve import serve

    return serve


def _route() -> click.Command:
    from harness.cli.route import route

    return route


def _study() -> click.Command:
    from harness.cli.study import study

    return study


COMMANDS: dict[str, tuple[Callable[[], click.Command], str]] = {
    "trace": (_trace, "Generate, import, inspect and query traces (Parquet + DuckDB)."),
    "demo": (_demo, "Run the pipeline on built-in defaults and say where the results are."),
    "bench": (_bench, "Measure speed and memory of latroute's heavy paths."),
    "calibrate": (_calibrate, "Fit a batch-time profile from the steps of traces."),
    "validate": (_validate, "Replay a recorded trace on the engine twin and compare with vLLM."),
    "estimate": (_estimate, "Estimate every measured request's TTFT with each estimator."),
    "replay": (_replay, "Replay a workload through one router on the engine twin of a pool."),
    "sweep": (_sweep, "Replay routers over arrival rates (and deltas, lambdas, seeds)."),
    "report": (_report, "Build an HTML and Markdown report from results."),
    "list": (_list, "List the built-in pools, profiles, routers or estimators."),
    "check": (_check, "Regression gate for CI: compare a result's metrics with a baseline."),
    "record": (_record, "Record a real vLLM engine's every step (in vLLM's own environment)."),
    "loadgen": (_loadgen, "Open-loop streaming load on an OpenAI-compatible endpoint."),
    "serve": (_serve, "A pool's instances as emulated vLLM servers (OpenAI API, /metrics), in real time."),
    "route": (_route, "A latroute router as an OpenAI-compatible proxy in front of vLLM backends."),
    "study": (_study, "Run a study and write the tables its results page shows."),
}


def main() -> None:
    cli(prog_name="latroute")

