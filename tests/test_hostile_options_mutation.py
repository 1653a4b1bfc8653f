"""A mutation run of the numeric and list options of the commands
whose options harness.cli.params, replay_options and serving_options define
(calibrate, validate, estimate, replay, sweep, trace generate). Every option
is given each hostile value of an explicit, fixed list (so a failure names its
case and reproduces): the value is either refused while the command line is
parsed, naming the option, or accepted and then inside the range the option's
help states. Parsing only (``make_context``), so the run takes well under a
second; the refusal path end to end is in tests/test_hostile_options.py."""
from __future__ import annotations

import math

import click
import pytest

from harness.cli import cli
from harness.cli.params import Finite, FloatList, IntIn, Window
from harness.cli.serving_options import check_goodput, check_percentiles

HOSTILE = ["nan", "NaN", "inf", "-inf", "-1", "0", "-0", "1e300", "1e-300", "-1e-300", "", " ", "1,1", "1,,2",
           "0x10", "1_0", "9" * 40, "9" * 5000, "1e400", "2**64", "1.5", "\u0661", "1;2", "50,50", "ttft:1,ttft:2",
           "0:0", "1:0", "0:nan"]
COMMANDS = [("calibrate",), ("validate",), ("estimate",), ("replay",), ("sweep",), ("trace", "generate")]


def command(path: tuple[str, ...]) -> click.Command:
    cmd: click.Command = cli
    for name in path:
        cmd = cmd.get_command(click.Context(cmd), name)  # latroute imports a command's module when asked
    return cmd


def checked_params(cmd: click.Command) -> list[click.Option]:
    return [p for p in cmd.params if isinstance(p, click.Option) and (
        isinstance(p.type, Finite | IntIn | FloatList | Window) or p.name in ("percentiles_text", "goodput_text"))]


def base_args(cmd: click.Command, skip: str) -> list[str]:
    """Placeholders for the command's required arguments and options."""
    args: list[str] = []
    for p in cmd.params:
        if p.name == skip or not p.required:
            continue
        if isinstance(p, click.Argument):
            args.append("T")
        else:
            args += [p.opts[0], "o"]
    return args


CASES = [(path, p.name) for path in COMMANDS for p in checked_params(command(path))]


def in_documented_range(p: click.Option, value) -> bool:
    t = p.type
    if isinstance(t, Finite):
        return t.check(value) == value and (math.isfinite(value) or t.allow_inf)
    if isinstance(t, IntIn):
        return isinstance(value, int) and t.lo <= value <= t.hi
    if isinstance(t, FloatList):
        return len(value) > 0 and len(set(value)) == len(value) and all(t.item.check(x) == x for x in value)
    if isinstance(t, Window):
        return 0 <= value[0] < value[1] <= 1
    if p.name == "percentiles_text":
        return bool(check_percentiles(value))
    return bool(check_goodput(value))


def test_the_mutation_run_covers_every_numeric_option():
    names = set(CASES)
    assert len(names) >= 40, len(names)
    for must in [(("replay",), "burstiness"), (("replay",), "percentiles_text"), (("replay",), "goodput_text"),
                 (("calibrate",), "max_evals"), (("estimate",), "ewma_tau"), (("validate",), "seed")]:
        assert must in names, must


def outcome(cmd: click.Command, p: click.Option, value: str) -> str | None:
    """None when ``value`` is refused naming the option or accepted within
    the documented range; else what went wrong."""
    args = [*base_args(cmd, p.name), p.opts[0], value]
    try:
        ctx = cmd.make_context(cmd.name or "", args)
    except click.BadParameter as e:
        named = p.opts[0] in e.format_message() or (e.param is not None and e.param.name == p.name)
        return None if named else f"refused without naming {p.opts[0]}: {e.format_message()}"
    except click.UsageError:  # e.g. a value read as an option name: refused, not run
        return None
    got = ctx.params[p.name]
    return None if in_documented_range(p, got) else f"accepted {got!r} outside the documented range"


@pytest.mark.parametrize("path,name", CASES, ids=[f"{' '.join(c[0])} {c[1]}" for c in CASES])
def test_hostile_values_are_refused_naming_the_option_or_accepted_in_range(path, name):
    cmd = command(path)
    p = next(q for q in cmd.params if q.name == name)
    bad = {v[:20]: why for v in HOSTILE if (why := outcome(cmd, p, v)) is not None}
    assert not bad, bad


@pytest.mark.parametrize("path", COMMANDS, ids=" ".join)
def test_every_numeric_option_states_its_range_in_the_help(path):
    cmd = command(path)
    ctx = click.Context(cmd, info_name=" ".join(path))
    for p in checked_params(cmd):
        if not isinstance(p.type, Finite | IntIn):
            continue
        opts, text = p.get_help_record(ctx)
        rng = p.type.range_text()
        assert rng and (rng in opts or rng in text.replace(" ", "")), (path, p.name, opts, rng)


def test_burstiness_range_is_the_one_the_arrivals_enforce():
    from harness.cli.params import BURSTINESS
    from traces.workload.arrivals import BURSTINESS_RANGE, ArrivalSpec, resolve_arrival

    assert (BURSTINESS.min, BURSTINESS.max) == BURSTINESS_RANGE
    for b in (1e-300, 0.009, 100.5, float("nan")):
        with pytest.raises(ValueError):
            resolve_arrival(None, b)
        with pytest.raises(ValueError):
            ArrivalSpec("gamma", burstiness=b).check()
    assert resolve_arrival(None, 0.01) == "gamma" and resolve_arrival("gamma", 100.0) == "gamma"
