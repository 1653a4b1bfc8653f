"""Fuzzing the live-run inputs: the server recording's
requests.csv and the client trace that ``trace join`` reads, and the
rotated parts (steps.NNNNN.jsonl, requests.NNNNN.csv) that ``record
finish`` joins. One random corruption each.

The promise: ``trace join`` succeeds (join.json written) or refuses naming
the corrupted file, input unchanged. ``record finish`` either refuses
naming the part, leaving every part in place and unchanged, or joins them
without losing a complete line: every newline-terminated row of the parts
is in the joined file (only a last line cut by a crash may be dropped)."""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.refusals.test_bad_input_files import small_recording
from tests.refusals.test_fuzz_stored import corrupt_table
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
from traces.store import TraceWriter
from traces.vllm_recorder.files import REQUEST_FIELDS

ENGINE = {"budget": 512, "max_seqs": 64, "block_size": 128, "num_kv_blocks": 1000, "model": "m",
          "vllm_version": "0.32.0"}
N = 20


def join_inputs(root: Path) -> None:
    """A client trace of N requests and the server's recording of them (and a warm-up request)."""
    ids = [f"t-{i}" for i in range(N)]
    ttft = [0.05 + 0.001 * i for i in range(N)]
    with TraceWriter(root / "client") as w:
        w.meta["source"] = {"kind": "loadgen"}
        w.write_table("requests", pd.DataFrame({
            "request_id": np.arange(N, dtype=np.int64), "arrival_s": np.arange(N) * 0.1,
            "prompt_tokens": np.full(N, 10), "output_tokens": np.full(N, 2), "ttft_s": ttft,
            "client_id": ids, "status": ["ok"] * N, "e2e_s": np.array(ttft) + 0.05}))
    rec = root / "rec"
    rec.mkdir()
    (rec / "engine.json").write_text(json.dumps(ENGINE, indent=1))
    lines = [",".join(REQUEST_FIELDS), "cmpl-w-0-aaaaaaaa,0.0,0.0,10,2,0.01,0.05,0.01,,0,w,f"]
    for i in range(N):
        a, t = 0.1 * i, ttft[i] - 0.01
        lines.append(f"cmpl-t-{i}-0-{i:08x},{a:.3f},{a:.3f},10,2,{a + t:.4f},{a + t + 0.04:.4f},{t:.4f},,0,t-{i},f")
    (rec / "requests.csv").write_text("\n".join(lines) + "\n")


def finish_inputs(root: Path) -> Path:
    """The parts a killed recording server leaves: a small recording split in two step parts and one request part."""
    src = small_recording(root / "src")
    rec = root / "parts"
    rec.mkdir()
    shutil.copy(src / "engine.json", rec / "engine.json")
    steps = (src / "steps.jsonl").read_text().splitlines(keepends=True)
    half = len(steps) // 2
    (rec / "steps.00000.jsonl").write_text("".join(steps[:half]))
    (rec / "steps.00001.jsonl").write_text("".join(steps[half:]))
    head, *rows = (src / "requests.csv").read_text().splitlines()
    out = [",".join(REQUEST_FIELDS)]
    for r in rows:
        c = r.split(",")
        out.append(",".join([*c[:8], "", "0", c[0], "finished_length_capped"]))
    (rec / "requests.00000.csv").write_text("\n".join(out) + "\n")
    return rec


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("live")
    join_inputs(root)
    (root / "src").mkdir()
    finish_inputs(root)
    return root


def _join_ok(out: Path) -> None:
    assert json.loads((out / "join.json").read_text())


def join_case(data, made: Path, run) -> tuple[str, str | None]:
    root = Path(tempfile.mkdtemp(prefix="fz-join-"))
    try:
        shutil.copytree(made / "client", root / "client")
        shutil.copytree(made / "rec", root / "rec")
        target = data.draw(st.sampled_from([root / "rec" / "requests.csv", root / "rec" / "engine.json",
                                            root / "client" / "requests.parquet", root / "client" / "meta.json"]),
                           label="file")
        if target.suffix == ".parquet":
            how = corrupt_table(data, target)
        else:
            how, new = corrupt(data, target.read_bytes(), kinds_for(target))
            target.write_bytes(new)
        watch = [root / "client", root / "rec"]
        before = tree_state(*watch)
        out = root / "out"
        o = run(["trace", "join", root / "client", root / "rec", "--out", out])
        return f"trace join: {target.parent.name}/{target.name}: {how}", broken_promise(
            o, [target.name], before, watch, out, _join_ok)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _complete_lines(raw: bytes, header: bool) -> int:
    n = raw.count(b"\n")
    return max(n - (1 if header else 0), 0)


def finish_case(data, made: Path, run) -> tuple[str, str | None]:
    root = Path(tempfile.mkdtemp(prefix="fz-fin-"))
    try:
        rec = root / "parts"
        shutil.copytree(made / "parts", rec)
        parts = sorted(p for p in rec.iterdir() if ".0" in p.name)
        target = data.draw(st.sampled_from(parts), label="part")
        how, new = corrupt(data, target.read_bytes(), kinds_for(target))
        target.write_bytes(new)
        want_steps = sum(_complete_lines(p.read_bytes(), False) for p in rec.glob("steps.0*.jsonl"))
        want_reqs = sum(_complete_lines(p.read_bytes(), True) for p in rec.glob("requests.0*.csv"))
        before = tree_state(rec)
        o = run(["record", "finish", rec])
        what = f"record finish: {target.name}: {how}"
        problem = broken_promise(o, [target.name], before, [rec], None, None, writes_inputs=True)
        if problem is None and o.code == 0:
            got_steps = _complete_lines((rec / "steps.jsonl").read_bytes(), False)
            got_reqs = _complete_lines((rec / "requests.csv").read_bytes(), True)
            if got_steps < want_steps or got_reqs < want_reqs:
                problem = (f"exit 0 and parts joined with rows lost: steps {got_steps}/{want_steps}, "
                           f"requests {got_reqs}/{want_reqs}")
        return what, problem
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_pristine_inputs_are_accepted(made, tmp_path):
    assert in_process(["trace", "join", made / "client", made / "rec", "--out", tmp_path / "j"]).code == 0
    shutil.copytree(made / "parts", tmp_path / "parts")
    assert in_process(["record", "finish", tmp_path / "parts"]).code == 0
    assert in_process(["trace", "import", "vllm-record", tmp_path / "parts", "--out", tmp_path / "t"]).code == 0


@quick(6)
@given(data=st.data())
def test_a_corrupted_join_input_keeps_the_promise(made, data):
    what, problem = join_case(data, made, in_process)
    assert problem is None, f"{what} → {problem}"


@quick(6)
@given(data=st.data())
def test_a_corrupted_part_keeps_record_finish_s_promise(made, data):
    what, problem = finish_case(data, made, in_process)
    assert problem is None, f"{what} → {problem}"


@pytest.mark.fuzz
def test_live_inputs_campaign(made):
    camp = Campaign("trace join, record finish", campaign_seconds(0.06))
    worker = Worker()

    @long_settings(100_000)
    @given(data=st.data())
    def one(data):
        camp.tick()
        case = join_case if data.draw(st.booleans(), label="join") else finish_case
        camp.judge(*case(data, made, lambda a: worker.run_confirmed(a, 60)))

    camp.run(one, worker)
    camp.finish()
