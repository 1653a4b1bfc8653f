"""Fuzzing vLLM recordings: one random corruption of one file of
a real recording (a consistent prefix of d1: engine.json, requests.csv,
steps.jsonl) at a random position, then every command that reads it.

The promise (tests/support/fuzz_corruptors.broken_promise): ``trace import vllm-record``
accepts the directory (a valid trace) or refuses it naming the corrupted
file; what it accepts, ``estimate``, ``validate``, ``calibrate`` and
``replay`` run on without a crash, hang, traceback or internal error (they
run in a worker process: Numba heap corruption kills the process). The
default suite runs a few imports; the ``-m fuzz`` campaign runs for its
share of LATROUTE_FUZZ_SECONDS and prints how many cases it ran."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import run_cli
from tests.refusals.test_bad_input_files import small_recording
from tests.support.clean_refusal import tree_state
from tests.support.fuzz_corruptors import (
    QUICK,
    Campaign,
    Worker,
    broken_promise,
    campaign_seconds,
    corrupt_one_file,
    in_process,
    long_settings,
)
from traces.store import open_trace


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return small_recording(tmp_path_factory.mktemp("pristine"))


def valid_trace(out: Path) -> None:
    t = open_trace(out)
    assert len(t.read("requests")) > 0


def names_of(rec: Path, target: Path) -> list[str]:
    """What a refusal may name: the corrupted file (its basename at least)."""
    return sorted(p.name for p in rec.iterdir())


@QUICK
@given(data=st.data())
def test_import_of_a_corrupted_recording_keeps_the_promise(pristine, data):
    root = Path(tempfile.mkdtemp(prefix="fz-rec-"))
    try:
        rec = root / "rec"
        shutil.copytree(pristine, rec)
        target, how = corrupt_one_file(data, rec)
        before = tree_state(rec)
        out = root / "out"
        o = in_process(["trace", "import", "vllm-record", rec, "--out", out])
        problem = broken_promise(o, names_of(rec, target), before, [rec], out, valid_trace)
        assert problem is None, f"trace import vllm-record: {target.name}: {how} → {problem}"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _downstream(tr: Path, profile: Path, root: Path) -> dict[str, list]:
    """Every kernel-running command on an imported (accepted) trace."""
    return {
        "estimate": ["estimate", tr, "--profile", profile, "--out", root / "est"],
        "validate": ["validate", tr, "--profile", profile, "--out", root / "val"],
        "calibrate": ["calibrate", tr, "--out", root / "cal.json"],
        "replay": ["replay", "--trace", tr, "--requests", "40", "--out", root / "rep"],
    }


def _output_ok(out: Path) -> None:
    assert out.exists(), f"{out.name} missing"


@pytest.mark.fuzz
def test_corrupted_recordings_never_crash_the_kernels(pristine, tmp_path):
    """estimate, validate, calibrate and replay never crash, hang or fail
    internally on anything the importer accepts, and the importer accepts
    or refuses every corruption cleanly (a 10-minute run: this
    campaign's share of LATROUTE_FUZZ_SECONDS, 0.4 by default)."""
    profile = tmp_path / "profile.json"
    base = tmp_path / "tr"
    assert run_cli("trace", "import", "vllm-record", pristine, "--out", base).exit_code == 0
    assert run_cli("calibrate", base, "--out", profile).exit_code == 0
    camp = Campaign("recordings→import,estimate,validate,calibrate,replay", campaign_seconds(0.4))
    worker = Worker()
    stats = {"accepted": 0, "refused": 0}

    @long_settings(100_000)
    @given(data=st.data())
    def one(data):
        camp.tick()
        root = Path(tempfile.mkdtemp(prefix="fz-rec-", dir=tmp_path))
        try:
            rec = root / "rec"
            shutil.copytree(pristine, rec)
            target, how = corrupt_one_file(data, rec, semantic=0.5)
            what = f"{target.name}: {how}"
            before = tree_state(rec)
            tr = root / "tr"
            o = worker.run_confirmed(["trace", "import", "vllm-record", rec, "--out", tr], 60, f"import {what}")
            camp.judge(f"trace import vllm-record {what}", broken_promise(o, names_of(rec, target), before, [rec], tr,
                                                                          valid_trace))
            if o.code != 0:
                stats["refused"] += 1
                return
            stats["accepted"] += 1
            names = [tr.name, target.name, *(p.name for p in tr.iterdir())]
            for cmd, args in _downstream(tr, profile, root).items():
                snap = tree_state(tr)
                out = Path(args[args.index("--out") + 1])
                o = worker.run_confirmed(args, 120, f"{cmd} on {what}")
                camp.judge(f"{cmd} on import of {what}", broken_promise(o, names, snap, [tr], out, _output_ok))
        finally:
            shutil.rmtree(root, ignore_errors=True)

    camp.run(one, worker)
    print(f"recordings: {stats['accepted']} corruptions accepted (then run through 4 commands), "
          f"{stats['refused']} refused")
    camp.finish()
