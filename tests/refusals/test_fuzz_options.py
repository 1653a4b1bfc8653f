"""Mutation run of the command line's numeric options: every
numeric option of every command, taken from the click objects themselves
(so an option added later is fuzzed too), given hostile values (NaN, ±inf,
-1, 0, 1e300, 1e-300, '', 2**63, 400 digits, '1,1', hex) on cheap inputs.

The promise: exit 0, or exit 2 with one ``error:`` line naming the option
(``loadgen`` against a closed port and ``record engine`` without vLLM may
exit 1, with one line and no internal error); never a traceback, an
internal error, a crash or a hang; nothing written when refused."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.cli import COMMANDS
from tests.conftest import run_cli
from tests.refusals.test_bad_input_files import small_recording
from tests.support.fuzz_corruptors import (
    Campaign,
    Outcome,
    Worker,
    broken_promise,
    campaign_seconds,
    in_process,
    long_settings,
    quick,
)

VALUES = ["NaN", "nan", "inf", "-inf", "-1", "0", "1e300", "1e-300", "", str(2**63), "9" * 400, "1,1", "-0", "0x10",
          "1e-7", str(2**31)]
NUMERIC = ("IntIn", "Finite", "FloatList", "KeyFraction", "EngineSetting", "Window", "IntParamType",
           "FloatParamType", "IntRange", "FloatRange")
SLOW = {"demo", "serve"}  # demo: a whole pipeline per run (its one numeric option, --seed, is fuzzed in replay
# and generate); serve: a server runs until signalled (its options are click types, tests/harness/serve/)


def walk(name: str, cmd: click.Command):
    if isinstance(cmd, click.Group):
        for n, c in sorted(cmd.commands.items()):
            yield from walk(f"{name} {n}", c)
    else:
        yield name, cmd


def numeric_options() -> list[tuple[str, str, str]]:
    """(command, option, its type's class name) for every numeric option."""
    found = []
    for n, (factory, _) in sorted(COMMANDS.items()):
        for name, cmd in walk(n, factory()):
            for p in cmd.params:
                kind = type(p.type).__name__
                if isinstance(p, click.Option) and not p.is_flag and kind in NUMERIC:
                    found.append((name, p.opts[0], kind))
    return found


def shaped(kind: str, option: str, value: str) -> str:
    """The hostile number in the shape the option takes."""
    if kind == "EngineSetting":
        return ("max_num_seqs=" if option == "--search" else "max_model_len=") + value
    if kind == "KeyFraction":
        return "*.mape=" + value
    if kind == "Window":
        return f"{value}:1" if len(value) % 2 else f"0:{value}"
    return value


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("opt-inputs")
    assert run_cli("trace", "import", "vllm-record", small_recording(root), "--out", root / "tr").exit_code == 0
    assert run_cli("trace", "generate", "--requests", "30", "--rate", "4", "--out", root / "wl").exit_code == 0
    (root / "az.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                                 "2023-11-16 18:15:50.9951690,396,109\n")
    return root


def base_args(cmd: str, root: Path, out: Path) -> tuple[list, tuple]:
    """Cheap arguments for each command, and the exits other than 0/2 it may give."""
    tr, wl = root / "tr", root / "wl"
    table = {
        "trace generate": (["trace", "generate", "--requests", "20", "--rate", "4", "--out", out], ()),
        "trace import": (["trace", "import", "azure", root / "az.csv", "--out", out], ()),
        "trace query": (["trace", "query", tr, "select count(*) from requests"], (1,)),  # 1: stopped by --timeout
        "calibrate": (["calibrate", tr, "--out", out], ()),
        "validate": (["validate", tr, "--profile", root / "profile.json", "--out", out], ()),
        "estimate": (["estimate", tr, "--profile", root / "profile.json", "--estimators", "sfs,throughput",
                      "--out", out], ()),
        "replay": (["replay", "--rate", "4", "--requests", "30", "--out", out], ()),
        "sweep": (["sweep", "--rates", "4", "--requests", "30", "--routers", "shortest-queue", "--workers", "1",
                   "--out", out], ()),
        "check": (["check", root / "rep", "--baseline", root / "base.json"], (1,)),
        "bench": (["bench", "--only", "generate", "--generate-requests", "200", "--workdir", out], ()),
        "record engine": (["record", "engine", wl, "--model", root / "no-model", "--out", out], (1,)),
        # route: a proxy runs until signalled, so it gets a pool that does not exist: a hostile number is refused
        # naming the option, a good one gets as far as the pool (exit 2 naming it), never as far as listening
        "route": (["route", "--pool", root / "no-pool.json", "--router", "shortest-queue", "--listen", "127.0.0.1:9"],
                  ()),
        # a study runs for minutes: it gets a data folder without the logs, so a good number gets as far as that
        # refusal (exit 2 naming --data) and never runs a command
        "study lmbench-h100": (["study", "lmbench-h100", "--data", root / "no-data", "--out", out], ()),
        # the other studies likewise stop at an input that is not there (a pool, a workload, OUT a file) or a
        # list refused by name (--windows), so a good number never starts a server or a command
        "study gpu-fidelity": (["study", "gpu-fidelity", "--data", root / "no-data", "--out", out], ()),
        "study route-live real": (["study", "route-live", "real", out, "--pool", root / "no-pool.json"], ()),
        "study route-live serve": (["study", "route-live", "serve", out, "--pool", root / "no-pool.json"], ()),
        "study route-live backends": (["study", "route-live", "backends", out, "--pool", root / "no-pool.json",
                                       "--trace", wl], ()),
        "study serve-faithfulness": (["study", "serve-faithfulness", out, "--pool", root / "no-pool.json"], ()),
        "study serve-scale": (["study", "serve-scale", out, "--pool", root / "no-pool.json"], ()),
        "study serve-real": (["study", "serve-real", out], ()),
        "study real-speed-cause": (["study", "real-speed-cause", out, "--workload", root / "no-wl",
                                    "--profile", root / "no-profile.json"], ()),
        "study learned": (["study", "learned", root / "az.csv"], ()),
        "study learned-fit-cost": (["study", "learned-fit-cost", "--windows", "5"], ()),
        "study fleet-diagnosis": (["study", "fleet-diagnosis", "--pool", root / "no-pool.json", "--rate", "4",
                                   "--requests", "30", "--out", out], ()),
        "study route-views": (["study", "route-views", "--pool", root / "no-pool.json"], ()),
        "study coverage": (["study", "coverage", root / "no-recordings", out], ()),
        "loadgen": (["loadgen", "--base-url", "http://127.0.0.1:9", "--num-prompts", "2", "--time-limit", "5",
                     "--out", out], (1,)),
    }
    return table[cmd]


def replace_or_add(args: list, option: str, value: str) -> list:
    args = list(args)
    if option in args:
        args[args.index(option) + 1] = value
        return args
    return [*args, option, value]


def judge(cmd: str, option: str, value: str, o: Outcome, out: Path, ok: tuple, inputs: Path) -> str | None:
    """The promise for a hostile option value. A refusal names the option,
    another option it conflicts with or needs (``--vllm-python``), or an
    input file the value was checked against (``calibrate --steps-window``
    with no step in it); never the output or its temporary: that is a
    value caught by the output checks after the work, not at the option."""
    problem = broken_promise(o, [option, "--", str(inputs)], {}, [], out, None, (0, *ok))
    lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
    if problem is None and o.code == 2 and (str(out) in lines[0] or f"/.{out.name}." in lines[0]):
        problem = f"refused only by the output check, after the work: {lines[0][:200]}"
    if problem is None and o.code == 2 and option not in lines[0] and str(inputs) not in lines[0] \
            and not re.search(r"(^error: |: )--[a-z]", lines[0]):
        problem = f"exit 2 naming neither the option nor an input: {lines[0][:200]}"
    if problem is None and o.code in ok and o.code != 0:
        if len(lines) != 1 or not lines[0].startswith("error: "):
            problem = f"exit {o.code} without one error line: {lines[:2]}"
    return problem


def one_case(data, inputs: Path, run, commands: set[str]) -> tuple[str, str | None]:
    cmd, option, kind = data.draw(st.sampled_from([c for c in numeric_options() if c[0] in commands]), label="option")
    value = shaped(kind, option, data.draw(st.sampled_from(VALUES), label="value"))
    root = Path(tempfile.mkdtemp(prefix="fz-opt-"))
    try:
        out = root / "out"
        args, ok = base_args(cmd, inputs, out)
        if cmd == "bench":
            out.mkdir()
        args = replace_or_add(args, option, value)
        o = run(args)
        if cmd == "bench":  # its scratch directory is given, not written: judge exit and lines only
            out = root / "never"
        return f"{cmd} {option} {value[:30]!r}", judge(cmd, option, value, o, out, ok, inputs)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_every_numeric_option_is_found():
    """The mutation run covers what the command line has today, and would
    cover an option added tomorrow (taken from click, not listed here)."""
    found = {(c, o) for c, o, _ in numeric_options()}
    assert {("replay", "--rate"), ("sweep", "--rates"), ("trace generate", "--requests"), ("check", "--max-speed-drift"),
            ("loadgen", "--time-limit"), ("calibrate", "--steps-window")} <= found
    covered = {c for c, _, _ in numeric_options()} - SLOW
    root = Path(tempfile.mkdtemp())
    try:
        for cmd in covered:
            base_args(cmd, root, root / "o")  # every command with a numeric option has cheap arguments
    finally:
        shutil.rmtree(root)


@quick(10)
@given(data=st.data())
def test_hostile_numbers_on_cheap_commands(inputs, data):
    what, problem = one_case(data, inputs, in_process, {"trace generate", "trace import"})
    assert problem is None, f"{what} → {problem}"


@pytest.mark.fuzz
def test_numeric_options_campaign(inputs):
    assert run_cli("calibrate", inputs / "tr", "--out", inputs / "profile.json").exit_code == 0
    assert run_cli("replay", "--rate", "4", "--requests", "30", "--out", inputs / "rep").exit_code == 0
    assert run_cli("check", inputs / "rep", "--baseline", inputs / "base.json", "--write-baseline").exit_code == 0
    camp = Campaign("numeric options", campaign_seconds(0.06))
    worker = Worker()
    commands = {c for c, _, _ in numeric_options()} - SLOW

    @long_settings(100_000)
    @given(data=st.data())
    def one(data):
        camp.tick()
        camp.judge(*one_case(data, inputs, lambda a: worker.run_confirmed(a, 90), commands))

    camp.run(one, worker)
    camp.finish()


if os.environ.get("LATROUTE_FUZZ_EXHAUSTIVE"):  # every (option, value) pair once, for a report
    @pytest.mark.fuzz
    @pytest.mark.parametrize("cmd,option,kind", numeric_options())
    def test_every_option_every_value(inputs, cmd, option, kind):
        if cmd in SLOW:
            pytest.skip("demo: a whole pipeline per value")
        bad = []
        for v in VALUES:
            root = Path(tempfile.mkdtemp(prefix="fz-opt-"))
            out = root / "out"
            args, ok = base_args(cmd, inputs, out)
            o = in_process(replace_or_add(args, option, shaped(kind, option, v)))
            p = judge(cmd, option, v, o, out, ok, inputs)
            if p:
                bad.append(f"{v[:20]!r} → {p}")
            shutil.rmtree(root, ignore_errors=True)
        assert not bad, bad
