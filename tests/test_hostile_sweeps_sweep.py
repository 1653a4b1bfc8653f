"""``sweep``'s own inputs and atomicity: ``--resume`` refuses a
corrupt, foreign or misplaced cell part naming it (the user deletes it and
the cell runs again) instead of crashing or folding it into the results;
``--spec`` refuses a file of the wrong shape, unknown keys beside a
``[sweep]`` table, deep nesting, directories and FIFOs; ``--backend ray``
without Ray and a plug-in router whose constructor fails are refused
before the sweep directory exists.

The cells run through a stand-in for ``run_cell`` (a row computed from the
cell alone, in microseconds): what is tested is the sweep's handling of
its directory, not the twin."""
from __future__ import annotations

import os
import shutil
import signal
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

import harness.sweep.driver as driver
from routers.base import Router
from tests.adversarial import refused_cleanly
from tests.conftest import run_cli

ARGS = ["--routers", "shortest-queue", "--rates", "4,8", "--requests", "20", "--workers", "1", "--noise", "off"]


def fake_cell(spec, cell) -> tuple[dict, dict]:
    """A cell's row as run_cell writes it (same columns), from the cell alone."""
    u = 1.0 / (1.0 + cell.rate)
    row = {**asdict(cell), "arrival": spec.arrival, "requests": spec.requests, "interarrival_cv2": 1.0,
           "lengths_policy": "column", "ontime_utility": u, "slo_attainment": u, "mean_utility": u,
           "mean_cost_micro_usd": 1.0, "ttft_mean_s": 0.1, "ttft_p50_s": 0.1, "ttft_p90_s": 0.2, "ttft_p99_s": 0.3,
           "unserved": 0, "simulated_s": 5.0, "share_a": 1.0}
    return row, {"wall_s": 0.01, "speedup": 500.0, "mean_decision_us": 1.0}


class BrokenAtBirth(Router):
    """a plug-in whose constructor fails"""

    def __init__(self, inputs):
        raise RuntimeError("no model file")

    def choose(self, i, t, insts) -> int:
        return 0


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(driver, "run_cell", fake_cell)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """One finished sweep, written once; each test corrupts its own copy."""
    out = tmp_path_factory.mktemp("template") / "s"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(driver, "run_cell", fake_cell)
        r = run_cli("sweep", *ARGS, "--out", out)
    assert r.exit_code == 0, r.output
    return out


@pytest.fixture
def finished(tmp_path, template, fast) -> Path:
    out = tmp_path / "s"
    shutil.copytree(template, out, symlinks=True)
    return out


def parts(out: Path) -> list[Path]:
    return sorted((out / "cells").glob("*.parquet"))


def resume(out: Path, *fragments: str) -> str:
    return refused_cleanly(["sweep", *ARGS, "--out", out, "--resume"], [out], *fragments)


# ------------------------------------------------------------------ --resume


@pytest.mark.parametrize("content", [b"", b"garbage\n", b"PAR1\x00\x00PAR1"], ids=["empty", "garbage", "stub"])
def test_resume_refuses_a_corrupt_cell_part_naming_it(finished, content):
    part = parts(finished)[0]
    part.write_bytes(content)
    resume(finished, part.name, "cell part", "delete it")


def test_resume_refuses_a_stray_cell_file_instead_of_folding_it_in(finished):
    stray = finished / "cells" / ("0" * 20 + ".parquet")
    part = parts(finished)[0]
    shutil.copy(part, stray)
    shutil.copy(part.with_suffix(".timing.json"), stray.with_suffix(".timing.json"))
    resume(finished, stray.name, "no cell of this sweep")


def test_resume_refuses_a_file_not_named_like_a_part(finished):
    (finished / "cells" / "notes.txt").write_text("mine")
    resume(finished, "notes.txt", "not a part of this sweep")


def test_resume_refuses_a_part_renamed_from_another_cell(finished):
    a, b = parts(finished)
    tmp = a.with_name("swap")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    resume(finished, "rate", "another cell")


@pytest.mark.parametrize("column,value", [("ontime_utility", "high"), ("rate", float("inf")),
                                          ("ontime_utility", float("nan")), ("arrival", "mmpp")])
def test_resume_refuses_a_part_with_a_bad_value(finished, column, value):
    part = parts(finished)[0]
    df = pd.read_parquet(part)
    df[column] = [value]
    df.to_parquet(part, index=False)
    resume(finished, part.name, column)


def test_resume_refuses_a_part_of_two_rows(finished):
    part = parts(finished)[0]
    df = pd.read_parquet(part)
    pd.concat([df, df]).to_parquet(part, index=False)
    resume(finished, part.name, "2 rows")


@pytest.mark.parametrize("what", ["directory", "fifo", "symlink", "device"])
def test_resume_refuses_a_part_that_is_not_a_file(finished, what):
    part = parts(finished)[0]
    keep = finished.parent / "kept.parquet"
    part.rename(keep)
    if what == "directory":
        part.mkdir()
    elif what == "fifo":
        os.mkfifo(part)
    elif what == "device":
        part.symlink_to("/dev/zero")
    else:
        part.symlink_to(keep)
    # a special file or link is refused by the output check (traces.files.output_checks) before the parts are read;
    # a directory by the parts check: both name the part
    resume(finished, part.name, "not a file" if what == "directory" else "only what latroute wrote")


def test_resume_refuses_cells_that_is_a_file(finished):
    shutil.rmtree(finished / "cells")
    (finished / "cells").write_text("")
    resume(finished, "cells", "not the sweep's directory")


@pytest.mark.parametrize("content", [None, "garbage", '{"wall_s": "x", "speedup": 1, "mean_decision_us": 1}',
                                     b'{"wall_s": "\xe9"}'], ids=["missing", "garbage", "string", "latin1"])
def test_resume_refuses_a_part_whose_timing_is_missing_or_corrupt(finished, content):
    timing = parts(finished)[0].with_suffix(".timing.json")
    if content is None:
        timing.unlink()
    else:
        timing.write_bytes(content if isinstance(content, bytes) else content.encode())
    resume(finished, "timing.json")


def test_resume_refuses_a_final_file_that_is_a_directory(finished):
    (finished / "results.parquet").unlink()
    (finished / "results.parquet").mkdir()
    resume(finished, "results.parquet", "directory")


def test_resume_reruns_a_deleted_part_and_gives_the_same_results(finished, fast):
    before = pd.read_parquet(finished / "results.parquet")
    part = parts(finished)[0]
    part.unlink()
    part.with_suffix(".timing.json").unlink()
    r = run_cli("sweep", *ARGS, "--out", finished, "--resume")
    assert r.exit_code == 0, r.output
    assert part.exists()
    pd.testing.assert_frame_equal(pd.read_parquet(finished / "results.parquet"), before)


# ------------------------------------------------------------------ --spec


SPECS = [
    ("beside.toml", "[sweep]\nrates = [4]\n[extra]\nrouters = ['x']\n", "beside.toml:3: extra", "beside the [sweep]"),
    ("beside2.toml", "requests = 20\n[sweep]\nrates = [4]\n", "beside2.toml:1: requests", "beside the [sweep]"),
    ("scalar.toml", "sweep = 5\n", "scalar.toml:1: sweep", "one [sweep] table"),
    ("aot.toml", "[[sweep]]\nrates = [4]\n", "aot.toml:1: sweep", "array of tables"),
    ("deep.toml", "rates = " + "[" * 1000 + "]" * 1000 + "\n", "deep.toml", "nested"),
    ("table.toml", "[sweep.rates]\nx = 1\n", "table.toml", "a table"),
    ("nested.toml", "rates = [[4, 8]]\n", "nested.toml:1: rates[1]", "nested array"),
    ("badvalue.toml", "rates = ['fast']\n", "badvalue.toml:1: rates", "finite number"),
    ("date.toml", "seed = 1979-05-27\n", "date.toml:1: seed", "date"),
    ("bool.toml", "routers = true\n", "bool.toml:1: routers", "not a value"),
    ("comma.toml", "routers = ['shortest-queue,round-robin']\n", "comma.toml:1: routers[1]", "comma"),
    ("syntax.toml", "rates = [4,\nrouters = 1\n", "syntax.toml:2", "not valid TOML"),
    ("latin1.toml", "pool = 'caf\xe9'\n", "latin1.toml:1", "not UTF-8"),
]


@pytest.mark.parametrize("name,text,where,reason", SPECS, ids=[s[0] for s in SPECS])
def test_spec_of_the_wrong_shape_is_refused_naming_file_line_and_key(tmp_path, fast, name, text, where, reason):
    spec = tmp_path / name
    spec.write_bytes(text.encode("latin-1" if "latin1" in name else "utf-8"))
    refused_cleanly(["sweep", "--spec", spec, "--out", tmp_path / "o"], [tmp_path], where, reason)


def test_spec_that_is_a_directory_is_refused(tmp_path, fast):
    (tmp_path / "study.toml").mkdir()
    refused_cleanly(["sweep", "--spec", tmp_path / "study.toml", "--out", tmp_path / "o"], [tmp_path],
                    "study.toml", "directory")


def test_spec_that_links_to_a_device_is_refused(tmp_path, fast):
    (tmp_path / "study.toml").symlink_to("/dev/null")  # main read it as an empty spec (and /dev/zero forever)
    signal.signal(signal.SIGALRM, _expire)
    signal.alarm(20)
    try:
        refused_cleanly(["sweep", "--spec", tmp_path / "study.toml", "--out", tmp_path / "o"], [tmp_path],
                        "study.toml", "character device")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)


def _expire(signum, frame):
    raise TimeoutError("blocked reading a special file")


def test_spec_that_is_a_fifo_is_refused_without_waiting(tmp_path):
    os.mkfifo(tmp_path / "study.toml")

    def expire(signum, frame):
        raise TimeoutError("sweep --spec blocked on a FIFO")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(20)
    try:
        refused_cleanly(["sweep", "--spec", tmp_path / "study.toml", "--out", tmp_path / "o"], [tmp_path],
                        "study.toml", "named pipe")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_spec_booleans_fill_on_off_options(tmp_path, fast):
    spec = tmp_path / "study.toml"
    spec.write_text("[sweep]\nrates = [4]\nrouters = ['shortest-queue']\nrequests = 20\nnoise = false\n"
                    "workers = 1\n")
    r = run_cli("sweep", "--spec", spec, "--out", tmp_path / "o")
    assert r.exit_code == 0, r.output
    import json

    assert json.loads((tmp_path / "o" / "sweep.json").read_text())["spec"]["noise"] is False


# ------------------------------------------------------------------ refused before OUT exists


def test_ray_backend_without_ray_is_refused_before_the_sweep_directory_exists(tmp_path, monkeypatch, fast):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as where it is not installed
    refused_cleanly(["sweep", *ARGS, "--backend", "ray", "--out", tmp_path / "s"], [tmp_path], "--backend", "Ray")
    assert not (tmp_path / "s").exists()


def test_plugin_whose_constructor_fails_is_refused_before_the_sweep_directory_exists(tmp_path, fast):
    args = [a if a != "shortest-queue" else f"shortest-queue,{__name__}:BrokenAtBirth" for a in ARGS]
    refused_cleanly(["sweep", *args, "--out", tmp_path / "s"], [tmp_path], f"{__name__}:BrokenAtBirth",
                    "RuntimeError", "no model file")
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------ --force


@pytest.mark.parametrize("where", ["notes.txt", "cells/notes.txt"])
def test_force_refuses_a_sweep_directory_holding_a_users_file(finished, where):
    """main: ``--force`` deleted a user's file put into a sweep directory
    (a sweep writes in place: no manifest names what it wrote)."""
    (finished / where).write_text("mine\n")
    refused_cleanly(["sweep", *ARGS, "--out", finished, "--force"], [finished], where, "only what latroute wrote")


def test_force_still_replaces_a_sweep(finished):
    r = run_cli("sweep", *ARGS, "--out", finished, "--force")
    assert r.exit_code == 0, r.output
    assert (finished / "results.parquet").is_file()
