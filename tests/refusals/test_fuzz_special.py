"""Special files in place of inputs: a FIFO, a directory, an
empty file and a symlink to /dev/zero where each reading command expects a
regular file (every file of a recording, a stored trace, a public CSV, a
profile, a pool, a baseline, a sweep spec, a sweep cell, a join's
recording, a part of ``record finish``).

The promise: refused with exit 2, one ``error:`` line naming the file,
nothing written, the input left as it was (a part is never followed or
deleted) — and never a hang: every run is a child process with a
deadline (20 s), so a FIFO that blocks an ``open`` fails the test instead of
hanging it. (An empty file may also be accepted where empty is valid.)"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli, shared
from tests.refusals.test_fuzz_live import finish_inputs, join_inputs
from tests.refusals.test_fuzz_results import SPEC, SPEC_CHEAP, SWEEP
from tests.support.clean_refusal import tree_state
from tests.support.fuzz_corruptors import Worker, broken_promise, record, subprocess_run

SPECIALS = ["fifo", "directory", "empty", "dev-zero"]
OPTIONAL = {"import lmbench runs.csv"}  # read only when it is there: ignoring what is not a file is allowed


def make_special(path: Path, kind: str) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_bytes(b"")
    else:
        path.symlink_to("/dev/zero")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    from tests.refusals.test_bad_input_files import small_recording
    from tests.refusals.test_fuzz_public import sources
    root = tmp_path_factory.mktemp("special")
    small_recording(root)  # root/rec
    sources(root / "pub")
    assert run_cli("trace", "import", "vllm-record", root / "rec", "--out", root / "tr").exit_code == 0
    assert run_cli("calibrate", root / "tr", "--out", root / "profile.json").exit_code == 0
    assert run_cli("replay", "--rate", "4", "--requests", "30", "--out", root / "rep").exit_code == 0
    assert run_cli("check", root / "rep", "--baseline", root / "base.json", "--write-baseline").exit_code == 0
    assert run_cli("sweep", *SWEEP, "--out", root / "sw").exit_code == 0
    from harness.twin.pools.spec import load_pool
    (root / "pool.json").write_text(json.dumps(load_pool("qwen3-h100").to_json()))
    (root / "spec.toml").write_text(SPEC)
    (root / "live").mkdir()
    join_inputs(root / "live")
    (root / "live" / "src").mkdir()
    finish_inputs(root / "live")
    return root


def sites(r: Path, out: Path) -> dict[str, tuple[list, Path, Path]]:
    """site: (arguments, the file made special, the directory watched)."""
    cells = sorted((r / "sw" / "cells").glob("*.parquet"))  # absent where only another site's files were copied
    cell = cells[0] if cells else r / "sw" / "cells" / "absent.parquet"
    p = r / "pub"
    return {
        "import vllm-record engine.json": (["trace", "import", "vllm-record", r / "rec", "--out", out], r / "rec" / "engine.json", r / "rec"),
        "import vllm-record requests.csv": (["trace", "import", "vllm-record", r / "rec", "--out", out], r / "rec" / "requests.csv", r / "rec"),
        "import vllm-record steps.jsonl": (["trace", "import", "vllm-record", r / "rec", "--out", out], r / "rec" / "steps.jsonl", r / "rec"),
        "import azure": (["trace", "import", "azure", p / "azure" / "AzureLLMInferenceTrace_conv.csv", "--out", out],
                         p / "azure" / "AzureLLMInferenceTrace_conv.csv", p / "azure"),
        "import mooncake": (["trace", "import", "mooncake", p / "mooncake" / "conversation_trace.jsonl", "--out", out],
                            p / "mooncake" / "conversation_trace.jsonl", p / "mooncake"),
        "import vllm-bench": (["trace", "import", "vllm-bench", p / "vllm-bench" / "bench.json", "--out", out],
                              p / "vllm-bench" / "bench.json", p / "vllm-bench"),
        "import lmbench runs.csv": (["trace", "import", "lmbench", p / "lmbench" / "per_request.csv", "--run", "r000",
                                     "--out", out], p / "lmbench" / "runs.csv", p / "lmbench"),
        "trace info meta.json": (["trace", "info", r / "tr"], r / "tr" / "meta.json", r / "tr"),
        "trace info requests.parquet": (["trace", "info", r / "tr"], r / "tr" / "requests.parquet", r / "tr"),
        "trace query steps.parquet": (["trace", "query", r / "tr", "select count(*) from steps"], r / "tr" / "steps.parquet", r / "tr"),
        "trace info --profile": (["trace", "info", r / "tr", "--profile", r / "profile.json"], r / "profile.json", r),
        "replay --pool": (["replay", "--pool", r / "pool.json", "--rate", "4", "--requests", "30", "--out", out], r / "pool.json", r),
        "check --baseline": (["check", r / "rep", "--baseline", r / "base.json"], r / "base.json", r),
        "check metrics.json": (["check", r / "rep", "--baseline", r / "base.json"], r / "rep" / "metrics.json", r / "rep"),
        "report metrics.json": (["report", r / "rep", "--out", out], r / "rep" / "metrics.json", r / "rep"),
        "sweep --spec": (["sweep", "--spec", r / "spec.toml", *SPEC_CHEAP, "--out", out], r / "spec.toml", r),
        "sweep --resume cell": (["sweep", *SWEEP, "--out", r / "sw", "--resume"], cell, r / "sw"),
        "trace join requests.csv": (["trace", "join", r / "live" / "client", r / "live" / "rec", "--out", out],
                                    r / "live" / "rec" / "requests.csv", r / "live" / "rec"),
        "record finish part": (["record", "finish", r / "live" / "parts"], r / "live" / "parts" / "requests.00000.csv",
                               r / "live" / "parts"),
        "record finish steps part": (["record", "finish", r / "live" / "parts"],
                                     r / "live" / "parts" / "steps.00001.jsonl", r / "live" / "parts"),
    }


def one(made: Path, tmp: Path, site: str, kind: str, run) -> str | None:
    root = tmp / f"{site.replace(' ', '_')}-{kind}"
    args0, target0, _ = sites(made, made / "out-dir")[site]
    needed = {Path(a).relative_to(made).parts[0] for a in [*map(str, args0), str(target0)]
              if Path(a).is_relative_to(made) and Path(a) != made / "out-dir"}
    root.mkdir()
    for n in needed:  # only what the command reads: copying everything per case was most of the time
        (shutil.copytree if (made / n).is_dir() else shutil.copy)(made / n, root / n)
    out = tmp / f"{site.replace(' ', '_')}-{kind}-out"  # beside the inputs, not in a watched directory
    args, target, watch = sites(root, out)[site]
    make_special(target, kind)
    before = tree_state(watch)
    o = run(args)
    ok = (0,) if kind == "empty" or site in OPTIONAL else ()
    joins = site.startswith("record finish") and kind == "empty"  # an empty part may be joined (and removed)
    problem = broken_promise(o, [target.name], before, [watch], out if "--out" in map(str, args) else None, None, ok,
                             writes_inputs=joins)
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    return problem


def test_a_fifo_in_place_of_a_csv_is_refused_not_waited_on(made, tmp_path):
    problem = one(made, tmp_path, "import azure", "fifo", lambda a: subprocess_run(a, timeout=30))
    assert problem is None, f"trace import azure with a FIFO → {problem}"


@pytest.mark.fuzz
def test_every_special_file_at_every_input(made, tmp_path):
    worker = Worker()
    bad, cases = [], 0
    try:
        for site in sites(made, made / "o"):
            for kind in SPECIALS:
                cases += 1
                p = one(made, tmp_path, site, kind, lambda a: worker.run_confirmed(a, 20))
                if p:
                    bad.append(f"{site}: {kind} → {p}")
                    record(f"special files: {site}: {kind} → {p}")
    finally:
        worker.close()
    print(f"fuzz special files: {cases} cases, {len(bad)} broken promises")
    assert not bad, "\n".join(bad)


def test_the_special_sites_are_valid_unchanged(made, tmp_path):
    """Every site's command succeeds on the untouched copy: a refusal above is the special file's."""
    shared("azure_llm_2023")
    for site in ["import vllm-record engine.json", "import azure", "trace info meta.json", "check --baseline"]:
        root = tmp_path / site.replace(" ", "_")
        shutil.copytree(made, root, symlinks=True)
        args, _, _ = sites(root, root / "out-dir")[site]
        assert run_cli(*args).exit_code in (0, 1), site
