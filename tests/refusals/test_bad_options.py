"""Bad options refused by the command line itself ("one error path",
"every CLI number range-checked").

Table-driven: every command x every numeric option x the values that used
to slip through (NaN, infinities, overflow, zero, negatives, fractions and
exponents for integers, empty and garbage text), and click's own usage
errors per command. Each case must be refused while the command line is
parsed, before any trace is read: exit 2, one ``error:`` line naming the
option, nothing written (``tests.support.clean_refusal.refused_cleanly``).

Then the other ends of the one path: an internal error is one line and
exit 1 (the traceback only with ``--debug`` or LATROUTE_DEBUG=1), Ctrl-C is
``interrupted`` and exit 130 (in process, and SIGINT to a real process),
and non-UTF-8 arguments never break the error printing.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli.params import MAX_COUNT, MAX_SEED, cores
from tests.conftest import run_cli
from tests.support.clean_refusal import refused_cleanly

# ---------------------------------------------------------------------------------------------------------------
# Bad values by the kind of number an option takes.
FLOAT_GARBAGE = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400", "", "x", "1,5", "0x10"]
BAD = {
    "positive": FLOAT_GARBAGE + ["0", "-0", "-1", "-1e-300"],
    "nonneg": FLOAT_GARBAGE + ["-1", "-1e-9", "-1e400"],
    "ge1": FLOAT_GARBAGE + ["0", "0.999", "-3"],
    "frac_open": FLOAT_GARBAGE + ["0", "1", "1.5", "-0.2"],
    "prob": FLOAT_GARBAGE + ["1", "1.0", "-0.1", "2"],
    "unit_open_closed": FLOAT_GARBAGE + ["0", "1.01", "-1"],  # (0, 1]
    "pct_50_100": FLOAT_GARBAGE + ["50", "100", "0", "101"],  # (50, 100)
    "rate_or_inf": [v for v in FLOAT_GARBAGE if v not in ("inf", "Infinity", "1e400")] + ["0", "-1"],
    "count": ["0", "-1", "-5", "1.5", "2.0", "1e3", "1e11", str(MAX_COUNT + 1), "9" * 80, "", "x", "nan", "inf",
              "1_000"],
    "seed": ["-1", str(MAX_SEED + 1), str(2**63), "1.5", "1e3", "", "x", "nan", "0x1"],
    "nonneg_int": ["-1", "1.5", "1e3", "", "x", "nan", "9" * 80],
    "small_int": ["0", "-1", "1.5", "1e3", "", "x", "nan", "9" * 80],
    "workers": ["0", "-1", str(cores() + 1), "10000", "1.5", "", "x"],
    "list_positive": ["0", "nan", "inf", "-inf", "", ",", "4,,6", "4,-1", "4,nan", "x", "1e400", "4;6"],
    "list_nonneg": ["nan", "inf", "-1", "", "1e-6,,1e-5", "0,nan", "x", "1e400"],
}


def _base(tmp: Path) -> dict[str, list]:
    """Arguments that make each command's line complete apart from the option
    under test (paths under ``tmp``, which need not exist: a refusal comes
    before anything is opened)."""
    out = tmp / "out"
    return {
        "replay": ["replay", "--out", out],
        "sweep": ["sweep", "--out", out],
        "trace generate": ["trace", "generate", "--out", out],
        "trace import": ["trace", "import", "azure", tmp / "in.csv", "--out", out],
        "calibrate": ["calibrate", tmp / "t", "--out", tmp / "p.json"],
        "estimate": ["estimate", tmp / "t", "--out", out],
        "validate": ["validate", tmp / "t", "--out", out],
        "loadgen": ["loadgen", "--base-url", "http://127.0.0.1:9", "--out", out],
        "record engine": ["record", "engine", tmp / "t", "--model", tmp / "m", "--out", out],
        "check": ["check", tmp / "r", "--baseline", tmp / "b.json"],
        "demo": ["demo", "--out", out],
        "bench": ["bench", "--workdir", tmp / "w"],
    }


OPTIONS: list[tuple[str, str, str]] = [  # (command, option, kind)
    *[("replay", o, k) for o, k in [
        ("--rate", "positive"), ("--request-rate", "positive"), ("--requests", "count"), ("--num-prompts", "count"),
        ("--seed", "seed"), ("--lambda", "nonneg"), ("--delta", "nonneg"), ("--burstiness", "positive"),
        ("--burst-ratio", "ge1"), ("--epsilon", "prob"), ("--view-interval", "nonneg")]],
    *[("sweep", o, k) for o, k in [
        ("--rates", "list_positive"), ("--deltas", "list_nonneg"), ("--lambdas", "list_nonneg"),
        ("--requests", "count"), ("--seeds", "small_int"), ("--num-seeds", "small_int"), ("--seed", "seed"),
        ("--workers", "workers"), ("--burstiness", "positive"), ("--burst-ratio", "ge1"), ("--epsilon", "prob"),
        ("--view-interval", "nonneg")]],
    *[("trace generate", o, k) for o, k in [
        ("--requests", "count"), ("--duration", "positive"), ("--rate", "positive"), ("--burst-ratio", "ge1"),
        ("--high-fraction", "frac_open"), ("--correlation-s", "positive"), ("--burstiness", "positive"),
        ("--turns", "ge1"), ("--think-time", "nonneg"), ("--system-prompts", "small_int"), ("--seed", "seed")]],
    ("trace import", "--seed", "seed"),
    ("trace import", "--chunk-rows", "count"),
    *[("calibrate", o, k) for o, k in [
        ("--holdout", "frac_open"), ("--stall-pct", "pct_50_100"), ("--seed", "seed"), ("--max-evals", "small_int"),
        ("--virtual-engines", "small_int")]],
    ("estimate", "--ewma-tau", "positive"),
    ("estimate", "--speed-half-life", "ge1"),
    ("validate", "--seed", "seed"),
    *[("loadgen", o, k) for o, k in [
        ("--num-prompts", "count"), ("--request-rate", "rate_or_inf"), ("--burstiness", "positive"),
        ("--seed", "seed"), ("--max-concurrency", "small_int"), ("--input-len", "small_int"),
        ("--output-len", "small_int"), ("--hash-block-tokens", "small_int"), ("--request-timeout", "positive"),
        ("--time-limit", "positive")]],
    *[("record engine", o, k) for o, k in [
        ("--max-num-batched-tokens", "small_int"), ("--max-num-seqs", "small_int"),
        ("--long-prefill-token-threshold", "nonneg_int"), ("--num-kv-blocks", "small_int"),
        ("--gpu-memory-utilization", "unit_open_closed"), ("--max-model-len", "small_int"),
        ("--hash-block-tokens", "small_int"), ("--seed", "seed"), ("--warmup", "nonneg_int"),
        ("--time-limit", "positive")]],
    ("check", "--max-speed-drift", "nonneg"),
    ("demo", "--seed", "seed"),
    *[("bench", o, k) for o, k in [
        ("--generate-requests", "count"), ("--import-rows", "count"), ("--twin-requests", "count"),
        ("--twin-rate", "positive")]],
]

NUMBER_CASES = [pytest.param(cmd, opt, val, id=f"{cmd}{opt}={val[:12]!r}")
                for cmd, opt, kind in OPTIONS for val in BAD[kind]]


@pytest.mark.parametrize("cmd,opt,value", NUMBER_CASES)
def test_bad_number_is_refused_while_parsing(tmp_path, cmd, opt, value):
    """The refusal names the option as the user typed it and says what it
    must be; it comes from the parser (the command path is in the line)."""
    line = refused_cleanly([*_base(tmp_path)[cmd], opt, value], [tmp_path], f"latroute {cmd}: ")
    shown = opt if opt not in ("--request-rate", "--num-prompts", "--num-seeds") else None
    assert shown is None or f"{shown}: " in line, line
    assert "must be" in line or "needs" in line, line


# The refused value may also come from a sweep --spec TOML file (the same types check it).
SPEC_CASES = [("rates = [0, 4]", "--rates"), ("rates = []", "--rates"), ("deltas = ['nan']", "--deltas"),
              ("lambdas = [-1]", "--lambdas"), ("requests = 0", "--requests"), ("requests = 1e11", "--requests"),
              ("seeds = 0", "--seeds"), ("seed = -1", "--seed"), ("workers = 100000", "--workers"),
              ("epsilon = 1.5", "--epsilon"), ("burst_ratio = 0.5", "--burst-ratio"),
              ("requests = true", "--requests"), ("rates = 'inf'", "--rates")]


@pytest.mark.parametrize("toml,opt", SPEC_CASES)
def test_bad_number_in_sweep_spec_is_refused(tmp_path, toml, opt):
    spec = tmp_path / "spec.toml"
    spec.write_text(toml + "\n")
    # the spec's own file, line and key, then the option whose rule it breaks
    refused_cleanly(["sweep", "--spec", spec, "--out", tmp_path / "out"], [tmp_path], f"{spec}:1: ", opt)


# Values whose whole meaning is in a KEY=VALUE or KEY:VALUE text.
TEXT_CASES = [
    (["check", "r", "--baseline", "b.json", "--tolerance", v], "--tolerance")
    for v in ("mape=nan", "mape=inf", "mape=-0.1", "mape=", "=0.1", "mape", "mape=1e400", "mape=x")
] + [
    (["replay", "--rate", "4", "--out", "o", "--goodput", v], "--goodput")
    for v in ("ttft:nan", "ttft:inf", "ttft:0", "ttft:-5", "nope:5", "ttft:x")
] + [
    (["replay", "--rate", "4", "--out", "o", "--metric-percentiles", v], "--metric-percentiles")
    for v in ("nan", "0", "101", "50,,x", "inf")
] + [
    ([cmd, "t", "--out", out, flag, v], flag)
    for cmd, out in (("calibrate", "p.json"), ("validate", "o"), ("estimate", "o"))
    for flag, v in (("--engine", "num_kv_blocks=" + "9" * 20), ("--engine", "max_num_seqs=-1"),
                    ("--engine", "watermark=nan"), ("--engine", "host_speed=inf"), ("--engine", "max_num_seqs=1.5"),
                    ("--engine", "nope=1"), ("--engine", "max_num_seqs"))
] + [
    (["calibrate", "t", "--out", "p.json", "--from-requests", "--search", v], "--search")
    for v in ("max_num_seqs=1,nan", "max_num_seqs=", "max_num_batched_tokens=" + "9" * 30, "watermark=0.1,inf")
] + [
    (["trace", "generate", "--out", "o", "--duration", "1e300", "--rate", "1"], "--duration"),
    (["sweep", "--out", "o", "--seed", str(MAX_SEED), "--seeds", "2"], "--seeds"),
]


@pytest.mark.parametrize("args,opt", TEXT_CASES, ids=lambda a: " ".join(map(str, a)) if isinstance(a, list) else a)
def test_bad_keyed_value_is_refused(tmp_path, monkeypatch, args, opt):
    monkeypatch.chdir(tmp_path)
    refused_cleanly(args, [tmp_path], f"{opt}: ")


def test_replay_nan_delta_and_lambda_refused_by_the_library_too():
    """``--delta nan`` routed every request to instance 0 (every comparison
    with NaN is false); the config refuses it whoever builds it."""
    from harness.twin.replay import ReplayConfig

    for kw in ({"delta_per_us": float("nan")}, {"lam": float("nan")}, {"lam": float("inf")}, {"delta_per_us": -1.0},
               {"epsilon": 1.0}, {"epsilon": float("nan")}, {"view_interval_ms": float("nan")}, {"seed": -1},
               {"seed": 2**32}):
        with pytest.raises(ValueError):
            ReplayConfig(router="sfs-soft", **kw)
    ReplayConfig(router="sfs-soft", delta_per_us=1e9, lam=0.0, epsilon=0.0, seed=2**32 - 1)


def test_loadgen_config_refuses_what_would_hang():
    from harness.live.loadgen import LoadgenConfig, generated_workload

    for kw in ({"request_timeout_s": float("nan")}, {"time_limit_s": 0.0}, {"request_rate": float("nan")},
               {"burstiness": float("inf")}, {"max_concurrency": 0}, {"prompt_format": "bytes"}):
        with pytest.raises(ValueError):
            LoadgenConfig(base_url="http://x", **kw)
    LoadgenConfig(base_url="http://x", request_rate=float("inf"))
    for args in ((0, 1.0, 1.0, 0, 4, 4), (3, float("nan"), 1.0, 0, 4, 4), (3, 1.0, 1.0, 0, 0, 4)):
        with pytest.raises(ValueError):
            generated_workload(*args)


# ---------------------------------------------------------------------------------------------------------------
# click's own usage errors: one line too, naming the command.
USAGE_CASES = [
    # (args, fragments)
    ([], ["error: latroute: missing command"]),
    (["nope"], ["No such command", "nope"]),
    (["trace"], ["latroute trace: missing command"]),
    (["record"], ["latroute record: missing command"]),
    (["trace", "nope"], ["latroute trace:", "nope"]),
    (["--no-such-flag"], ["latroute:", "--no-such-flag"]),
    (["list"], ["latroute list: Missing argument", "pools|profiles"]),
    (["list", "nope"], ["latroute list: KIND:", "nope"]),
    (["list", "routers", "extra"], ["latroute list:", "extra"]),
    (["trace", "info"], ["latroute trace info:", "DIR"]),
    (["trace", "query", "d"], ["latroute trace query:", "SQL"]),
    (["trace", "query", "d", "select 1", "--format", "xml"], ["--format:", "xml"]),
    (["trace", "generate"], ["Missing option", "--out"]),
    (["trace", "generate", "--out", "o", "--arrival", "weird"], ["--arrival:", "weird"]),
    (["trace", "import"], ["latroute trace import:", "FORMAT"]),
    (["trace", "import", "azure"], ["latroute trace import:", "SRC"]),
    (["trace", "import", "azure", "x.csv"], ["--out"]),
    (["trace", "join", "c"], ["latroute trace join:", "RECORDING_DIR"]),
    (["calibrate", "--out", "p.json"], ["latroute calibrate:", "TRACES"]),
    (["calibrate", "t", "--out", "p.json", "--form", "eq99"], ["--form:", "eq99"]),
    (["calibrate", "t", "--out", "p.json", "--loss", "huber"], ["--loss:", "huber"]),
    (["validate", "t"], ["--out"]),
    (["validate", "t", "--out", "o", "--noise", "maybe"], ["--noise:", "maybe"]),
    (["validate", "t", "--out", "o", "--prefix-cache", "hot"], ["--prefix-cache:", "hot"]),
    (["estimate", "t"], ["--out"]),
    (["estimate", "t", "--out", "o", "--online-speed", "yes"], ["--online-speed:", "yes"]),
    (["replay"], ["--out"]),
    (["replay", "--out", "o", "--noise", "loud"], ["--noise:", "loud"]),
    (["replay", "--out", "o", "--arrival", "weird"], ["--arrival:", "weird"]),
    (["replay", "--out", "o", "--slo", "strict"], ["--slo:", "strict"]),
    (["replay", "--out", "o", "--quality", "best"], ["--quality:", "best"]),
    (["replay", "--out", "o", "--ledger", "maybe"], ["--ledger:", "maybe"]),
    (["replay", "--out"], ["--out", "requires an argument"]),
    (["replay", "--out", "o", "positional"], ["latroute replay:", "positional"]),
    (["sweep"], ["--out"]),
    (["sweep", "--out", "o", "--backend", "slurm"], ["--backend:", "slurm"]),
    (["report", "--out", "o"], ["latroute report:", "RESULTS"]),
    (["report", "r"], ["--out"]),
    (["check"], ["latroute check:", "RESULT"]),
    (["record", "engine", "t", "--out", "o"], ["--model"]),
    (["record", "finish"], ["latroute record finish:", "DIR"]),
    (["loadgen", "--out", "o"], ["--base-url"]),
    (["loadgen", "--base-url", "http://x", "--out", "o", "--prompt-format", "xml"], ["--prompt-format:", "xml"]),
    (["bench", "--only", "nothing"], ["--only:", "nothing"]),
    (["demo", "--seed"], ["--seed", "requires an argument"]),
    (["replay", "--debug"], ["latroute replay:", "--debug"]),  # --debug is the group's option
]
COMMANDS_FOR_UNKNOWN_OPTION = [["trace", "info"], ["trace", "query"], ["trace", "generate"], ["trace", "import"],
                               ["trace", "join"], ["demo"], ["bench"], ["calibrate"], ["validate"], ["estimate"],
                               ["replay"], ["sweep"], ["report"], ["list"], ["check"], ["record", "engine"],
                               ["record", "finish"], ["loadgen"]]


@pytest.mark.parametrize("args,fragments", USAGE_CASES, ids=lambda a: " ".join(a) if isinstance(a, list) else None)
def test_click_usage_error_is_one_line(tmp_path, monkeypatch, args, fragments):
    monkeypatch.chdir(tmp_path)
    line = refused_cleanly(args, [tmp_path], *fragments)
    assert "Usage:" not in line and "Try '" not in line


@pytest.mark.parametrize("cmd", COMMANDS_FOR_UNKNOWN_OPTION, ids=" ".join)
def test_unknown_option_is_one_line_per_command(tmp_path, monkeypatch, cmd):
    monkeypatch.chdir(tmp_path)
    refused_cleanly([*cmd, "--frobnicate", "1"], [tmp_path], f"latroute {' '.join(cmd)}: ", "--frobnicate")


@pytest.mark.parametrize("cmd", [[], *COMMANDS_FOR_UNKNOWN_OPTION], ids=lambda c: " ".join(c) or "latroute")
def test_help_still_works(cmd):
    res = run_cli(*cmd, "--help")
    assert res.exit_code == 0 and "Usage:" in res.stdout and not res.stderr, res.output


def test_version_still_works():
    res = run_cli("--version")
    assert res.exit_code == 0 and "version" in res.stdout
