"""Fuzzing what latroute wrote and reads back: result
directories given to ``report`` and ``check`` (metrics.json, metrics.parquet),
baselines, sweep directories (``sweep --resume``: cells, results.parquet,
sweep.json), sweep specs (``sweep --spec`` TOML), pool files (``replay
--pool``) and profile files (``trace info --profile``, ``validate
--profile``). One random corruption of one file each, then the command.

The promise (tests/support/fuzz_corruptors.broken_promise): a clean success or a refusal
naming the corrupted file; ``check`` may also exit 1 (a regression found).
``sweep --resume`` may complete its directory when it succeeds."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.twin.pools.spec import load_pool
from tests.conftest import run_cli
from tests.refusals.test_bad_input_files import small_recording
from tests.support.clean_refusal import tree_state
from tests.support.fuzz_corruptors import (
    Campaign,
    Worker,
    broken_promise,
    campaign_seconds,
    corrupt,
    in_process,
    kinds_for,
    long_settings,
    quick,
)

SWEEP = ["--rates", "3,4", "--requests", "30", "--routers", "shortest-queue", "--workers", "1", "--noise", "off"]
# flags beside a fuzzed spec: an empty or cut spec means the default sweep (minutes, not a hang); these keep
# every run small while the spec's other keys (rates, routers, seed, deltas, lambdas) are fuzzed
SPEC_CHEAP = ["--requests", "30", "--workers", "1"]
SPEC = """# a small sweep: the base of the spec fuzzer
[sweep]
rates = [3, 4]
routers = ["shortest-queue"]
requests = 30
workers = 1
seed = 0
deltas = [1e-6]
lambdas = [0.0005]
"""


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """Every kind of file the fuzzers corrupt, written by latroute itself."""
    root = tmp_path_factory.mktemp("made")
    (root / "pool.json").write_text(json.dumps(load_pool("qwen3-h100").to_json(), indent=1))
    assert run_cli("replay", "--rate", "4", "--requests", "40", "--out", root / "rep").exit_code == 0
    assert run_cli("check", root / "rep", "--baseline", root / "base.json", "--write-baseline").exit_code == 0
    return root


@pytest.fixture(scope="module")
def made_all(made) -> Path:
    """And the slower ones: estimate and validate results, a sweep, a profile."""
    root = made
    assert run_cli("trace", "import", "vllm-record", small_recording(root), "--out", root / "tr").exit_code == 0
    assert run_cli("calibrate", root / "tr", "--out", root / "profile.json").exit_code == 0
    assert run_cli("estimate", root / "tr", "--profile", root / "profile.json", "--out", root / "est").exit_code == 0
    assert run_cli("validate", root / "tr", "--profile", root / "profile.json", "--out", root / "val").exit_code == 0
    assert run_cli("check", root / "est", "--baseline", root / "est-base.json", "--write-baseline").exit_code == 0
    assert run_cli("sweep", *SWEEP, "--out", root / "sw").exit_code == 0
    (root / "spec.toml").write_text(SPEC)
    return root


def _dir_ok(out: Path) -> None:
    assert out.is_dir() and any(out.iterdir()), f"{out.name} empty"


def _sweep_ok(sw: Path, cells: int | None = 2) -> None:
    """A complete sweep: its results (2 cells for the base sweep; a fuzzed
    spec may ask for other cells) and metrics."""
    import pandas as pd
    n = len(pd.read_parquet(sw / "results.parquet"))
    assert n == cells if cells is not None else n > 0, f"{n} cells"
    json.loads((sw / "metrics.json").read_text())


def _spec_sweep_ok(sw: Path) -> None:
    _sweep_ok(sw, None)


# name: (what is copied, the file(s) to corrupt under it, args(copy root, out), output check, ok codes, writes)
def cases(root: Path) -> dict:
    return {
        "check": ("rep", "rep", lambda c, o: ["check", c / "rep", "--baseline", c / "base.json"], None, (0, 1), False),
        "check-baseline": ("base.json", "base.json", lambda c, o: ["check", c / "rep", "--baseline", c / "base.json"],
                           None, (0, 1), False),
        "check-est": ("est", "est", lambda c, o: ["check", c / "est", "--baseline", c / "est-base.json",
                                                  "--max-speed-drift", "0.5"], None, (0, 1), False),
        "report": ("est", "est", lambda c, o: ["report", c / "est", c / "val", "--out", o], _dir_ok, (0,), False),
        "report-val": ("val", "val", lambda c, o: ["report", c / "val", "--out", o], _dir_ok, (0,), False),
        "sweep --resume": ("sw", "sw", lambda c, o: ["sweep", *SWEEP, "--out", c / "sw", "--resume"], None, (0,), True),
        "report-sweep": ("sw", "sw", lambda c, o: ["report", c / "sw", "--out", o], _dir_ok, (0,), False),
        "sweep --spec": ("spec.toml", "spec.toml", lambda c, o: ["sweep", "--spec", c / "spec.toml", *SPEC_CHEAP, "--out", o],
                         _spec_sweep_ok, (0,), False),
        "replay --pool": ("pool.json", "pool.json", lambda c, o: ["replay", "--pool", c / "pool.json", "--rate", "4",
                                                                  "--requests", "40", "--out", o], _dir_ok, (0,), False),
        "trace info --profile": ("profile.json", "profile.json",
                                 lambda c, o: ["trace", "info", c / "tr", "--profile", c / "profile.json"], None, (0,), False),
        "validate --profile": ("profile.json", "profile.json",
                               lambda c, o: ["validate", c / "tr", "--profile", c / "profile.json", "--out", o],
                               _dir_ok, (0,), False),
    }


NEEDS = {"check": ["rep", "base.json"], "check-baseline": ["rep", "base.json"], "check-est": ["est", "est-base.json"],
         "report": ["est", "val"], "report-val": ["val"], "sweep --resume": ["sw"], "report-sweep": ["sw"],
         "sweep --spec": ["spec.toml"], "replay --pool": ["pool.json"], "trace info --profile": ["tr", "profile.json"],
         "validate --profile": ["tr", "profile.json"]}


def one_case(data, made: Path, run, names: list[str]) -> tuple[str, str | None]:
    name = data.draw(st.sampled_from(names), label="command")
    copied, _, argf, valid, ok, writes = cases(made)[name]
    root = Path(tempfile.mkdtemp(prefix="fz-res-"))
    try:
        for n in NEEDS[name]:
            (shutil.copytree if (made / n).is_dir() else shutil.copy)(made / n, root / n)
        base = root / copied
        files = sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else [base]
        if name == "sweep --resume" and data.draw(st.booleans(), label="delete a cell"):
            cell = data.draw(st.sampled_from(sorted((base / "cells").glob("*.parquet"))), label="cell")
            cell.unlink()
            target, how = cell, "cell deleted"
        else:
            target = data.draw(st.sampled_from(files), label="file")
            how, new = corrupt(data, target.read_bytes(), kinds_for(target))
            target.write_bytes(new)
        watch = [root / n for n in NEEDS[name]]
        before = tree_state(*watch)
        out = root / "out"
        o = run(argf(root, out))
        check = _sweep_ok if name == "sweep --resume" else valid
        target_for_check = root / "sw" if name == "sweep --resume" else out
        if name == "sweep --resume" and o.code == 2:
            target_for_check = None  # a refused --resume: its directory is the input, judged unchanged by watch
        problem = broken_promise(o, [target.name], before, watch, target_for_check if check else None, check, ok,
                                 writes_inputs=writes)
        if name == "sweep --resume" and o.code == 2:
            problem = problem or broken_promise(o, [target.name], before, watch, out, None, ok)
        return f"{name}: {target.relative_to(root)}: {how}", problem
    finally:
        shutil.rmtree(root, ignore_errors=True)


CHEAP = ["check", "check-baseline"]


@quick(6)
@given(data=st.data())
def test_a_corrupted_result_or_baseline_keeps_check_s_promise(made, data):
    what, problem = one_case(data, made, in_process, CHEAP)
    assert problem is None, f"{what} → {problem}"


@pytest.mark.fuzz
def test_results_sweeps_pools_profiles_campaign(made_all):
    camp = Campaign("results, sweeps, specs, pools, profiles", campaign_seconds(0.1))
    worker = Worker()
    names = list(cases(made_all))

    @long_settings(100_000)
    @given(data=st.data())
    def one(data):
        camp.tick()
        camp.judge(*one_case(data, made_all, lambda a: worker.run_confirmed(a, 120), names))

    camp.run(one, worker)
    camp.finish()
