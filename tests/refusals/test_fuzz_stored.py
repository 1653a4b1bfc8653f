"""Fuzzing stored traces: a trace directory written by
``traces.store.TraceWriter`` (the import of a small recording: Parquet
tables and meta.json), one random corruption: meta.json's text, a Parquet
file's bytes, or a table rewritten with one hostile cell, a dropped column,
a column of another type or duplicated rows. Then every command that reads
a stored trace: ``trace info``, ``trace query``, ``estimate``,
``validate``, ``calibrate``, ``replay --trace``.

The promise (tests/support/fuzz_corruptors.broken_promise): a clean success or a refusal
naming the corrupted file; the kernel-running commands run in a worker
process, so a crash is a failure, not the end of the test run."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

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

HOSTILE_CELLS = [np.nan, np.inf, -np.inf, -1, 0, 1e300, 2**62, -(2**62), 0.5]


def corrupt_table(data: st.DataObject, path: Path) -> str:
    """Rewrite one Parquet table with one structural corruption; returns how."""
    df = pd.read_parquet(path)
    kind = data.draw(st.sampled_from(["cell", "drop-column", "retype", "dup-rows", "no-rows", "extra-column"]),
                     label="table corruption")
    if kind == "no-rows":
        df = df.iloc[:0]
    elif kind == "dup-rows":
        df = pd.concat([df, df.iloc[:3]], ignore_index=True)
    elif kind == "extra-column":
        df["zzz"] = 1
    elif len(df.columns) and kind in ("cell", "drop-column", "retype"):
        col = data.draw(st.sampled_from(list(df.columns)), label="column")
        if kind == "drop-column":
            df = df.drop(columns=[col])
        elif kind == "retype":
            df[col] = df[col].astype(str)
        elif len(df):
            row = data.draw(st.integers(0, len(df) - 1), label="row")
            value = data.draw(st.sampled_from(HOSTILE_CELLS + ["x", None]), label="value")
            df[col] = df[col].astype(object)
            df.loc[row, col] = value
            try:
                df[col] = pd.to_numeric(df[col]) if not isinstance(value, str) else df[col]
            except (ValueError, TypeError):
                pass
            kind = f"cell row {row + 1} = {value!r}"
        kind = f"{kind} {col}"
    try:
        df.to_parquet(path, index=False)
    except Exception:  # noqa: BLE001 - a mixed column Arrow cannot store: store it as text
        df.astype(str).to_parquet(path, index=False)
    return kind


def corrupt_trace(data: st.DataObject, tr: Path) -> tuple[Path, str]:
    files = sorted(p for p in tr.iterdir() if p.is_file())
    target = data.draw(st.sampled_from(files), label="file")
    if target.suffix == ".parquet" and data.draw(st.booleans(), label="structural"):
        return target, corrupt_table(data, target)
    how, new = corrupt(data, target.read_bytes(), kinds_for(target))
    target.write_bytes(new)
    return target, how


@pytest.fixture(scope="module")
def stored(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stored")
    assert run_cli("trace", "import", "vllm-record", small_recording(root), "--out", root / "tr").exit_code == 0
    return root


@pytest.fixture(scope="module")
def stored_profile(stored) -> Path:
    """And a profile calibrated on it, for estimate and validate (the campaign only)."""
    assert run_cli("calibrate", stored / "tr", "--out", stored / "profile.json").exit_code == 0
    return stored


def reading_commands(tr: Path, profile: Path, out: Path) -> dict[str, list]:
    return {
        "trace info": ["trace", "info", tr],
        "trace info --json": ["trace", "info", tr, "--json"],
        "trace query": ["trace", "query", tr, "select count(*), sum(prompt_tokens) from requests"],
        "estimate": ["estimate", tr, "--profile", profile, "--out", out],
        "validate": ["validate", tr, "--profile", profile, "--out", out],
        "calibrate": ["calibrate", tr, "--out", out],
        "replay": ["replay", "--trace", tr, "--requests", "40", "--out", out],
    }


CHEAP = ["trace info", "trace info --json", "trace query"]


def one_case(data, stored: Path, run, commands: list[str]) -> list[tuple[str, str | None]]:
    root = Path(tempfile.mkdtemp(prefix="fz-st-"))
    try:
        tr = root / "tr"
        shutil.copytree(stored / "tr", tr)
        target, how = corrupt_trace(data, tr)
        # the corrupted file, or another table of the trace it now contradicts (named, with its row)
        names = sorted({target.name, *(p.name for p in tr.iterdir() if p.is_file())})
        results = []
        for cmd in commands:
            out = root / f"out-{cmd.replace(' ', '_')}"
            args = reading_commands(tr, stored / "profile.json", out)[cmd]
            before = tree_state(tr)
            o = run(args)
            results.append((f"{cmd}: {target.name}: {how}",
                            broken_promise(o, names, before, [tr], out if "--out" in args else None)))
        return results
    finally:
        shutil.rmtree(root, ignore_errors=True)


@quick(5)
@given(data=st.data())
def test_a_corrupted_stored_trace_keeps_the_promise_of_info_and_query(stored, data):
    for what, problem in one_case(data, stored, in_process, CHEAP[1:]):
        assert problem is None, f"{what} → {problem}"


@pytest.mark.fuzz
def test_stored_trace_campaign(stored_profile):
    stored = stored_profile
    camp = Campaign("stored traces→info,query,estimate,validate,calibrate,replay", campaign_seconds(0.1))
    worker = Worker()
    commands = list(reading_commands(Path("t"), Path("p"), Path("o")))

    @long_settings(100_000)
    @given(data=st.data())
    def one(data):
        camp.tick()
        for what, problem in one_case(data, stored, lambda a: worker.run_confirmed(a, 120), commands):
            camp.judge(what, problem)

    camp.run(one, worker)
    camp.finish()
