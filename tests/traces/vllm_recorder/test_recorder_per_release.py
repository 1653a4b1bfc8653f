"""The recorder under each vLLM release of the window (a developer run:
``-m vllm_versions``; each release's interpreter named by
``LATROUTE_VLLM_PYTHON_X_Y_Z``, as for the peer fixtures; skipped without).

Two checks per release, because some releases installed here cannot run a
model at all (their compiled kernels were built for another torch) while
their scheduler, the only part of vLLM the recorder wraps, is pure Python:

- without a model: the peer generator drives the release's own scheduler,
  built as ``RecordingScheduler``, through scenarios with a preemption, a
  prefix-cache hit and a long-prefill cap; the recording must hold exactly
  the batches, preemptions and hits the scheduler made, and the state
  feed's frame after each ``schedule()`` its queues and free blocks;
- with the tiny model: ``latroute record engine`` records six requests (a
  shared two-block prefix) end to end and the recording imports. A release
  whose ``vllm._C`` does not load is skipped, with the error, as one that
  cannot run a model here.

``docs/reference/vllm-releases.md`` ("The recorder per release") holds the
outcome per release and the command.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from estimators.engine import layout as L
from harness.live.record import driver_env, vllm_release
from harness.serve.state_feed import decode
from tests.conftest import run_cli
from tests.peer import releases
from tests.traces.vllm_recorder.test_recorder import TINY_A, _session_trace

SCENARIOS = ("preempt_two_from_tail", "apc_admission_counts_touched_hits", "lone_request_exemption")
_VARIABLE = re.compile(r"^LATROUTE_VLLM_PYTHON_(\d+)_(\d+)_(\d+)$")


def _releases() -> list[str]:
    """The stored peer releases, and any other release whose variable is set."""
    named = {".".join(m.groups()) for m in map(_VARIABLE.match, os.environ) if m}
    return sorted(set(releases.versions()) | named, key=lambda v: tuple(map(int, v.split("."))))


def _python(version: str) -> str:
    var = releases.python_variable(version)
    python = os.environ.get(var)
    if not python:
        pytest.skip(f"{var} not set (the Python of an environment with vLLM {version})")
    return python


@pytest.mark.vllm_versions
@pytest.mark.parametrize("version", _releases())
def test_recorder_sees_every_batch_the_releases_scheduler_makes(version: str, tmp_path: Path):
    python = _python(version)
    assert vllm_release(python) == version
    script = Path(__file__).with_name("record_without_model.py")
    res = subprocess.run([python, str(script), str(tmp_path), *SCENARIOS], env=driver_env(),
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    for name in SCENARIOS:
        peer = json.loads((tmp_path / f"{name}.peer.json").read_text())["steps"]
        rec = tmp_path / name
        assert json.loads((rec / "engine.json").read_text())["vllm_version"] == version
        steps = [json.loads(line) for line in (rec / "steps.jsonl").read_text().splitlines()]
        made = [s for s in peer if s["batch"]]  # a step that schedules nothing is not a step of the format
        assert len(steps) == len(made) > 0, name
        for ours, theirs in zip(steps, made):
            assert [item[:3] for item in ours["items"]] == theirs["batch"], (name, ours["step"])
            assert sorted(ours["preempted"]) == theirs["preempted"], (name, ours["step"])
        req = pd.read_csv(rec / "requests.csv", dtype={"id": str})
        first = {}
        for s in made:
            for rid, _, before in s["batch"]:
                first.setdefault(rid, before)
        assert dict(zip(req["id"], req["cached_tokens"])) == first, name  # the hit granted at first scheduling
        assert (req["status"] != "unfinished").all()
        assert json.loads((rec / "recorder.json").read_text())["steps"] == len(made)
        _frames_agree(tmp_path / f"{name}.frames", peer, name)
    hits = pd.read_csv(tmp_path / "apc_admission_counts_touched_hits" / "requests.csv")["cached_tokens"]
    assert hits.max() > 0  # the scenario's prefix hit reached the recording
    assert any(s["preempted"] for s in map(json.loads, (tmp_path / "preempt_two_from_tail" / "steps.jsonl")
                                           .read_text().splitlines()))


def _frames_agree(path: Path, peer: list[dict], name: str) -> None:
    """Each frame (one per schedule()) holds the scheduler's queues, in
    order, its free blocks and the batch just planned."""
    data = path.read_bytes()
    k = 0
    for s in peer:
        n = int.from_bytes(data[k:k + 8], "little")
        head, a = decode(data[k + 8:k + 8 + n])
        k += 8 + n
        ids = head["ids"]
        nr, nw = int(a["sc"][L.S_NR]), int(a["sc"][L.S_WN])
        assert [ids[str(i)] for i in range(nr)] == s["running"], (name, s["step"])
        assert [ids[str(i)] for i in range(nr, nr + nw)] == s["waiting"], (name, s["step"])
        assert int(a["sc"][L.S_FREE_BLOCKS]) == s["free_blocks_scheduled"], (name, s["step"])
        row = {v: int(i) for i, v in ids.items()}
        assert [[ids[str(i)], int(t), int(c)] for i, t, c in zip(a["slot"], a["tokens"], a["computed"])] == s["batch"]
        assert all(int(a["req"][row[rid], L.F_COMPUTED]) == before + t for rid, t, before in s["batch"])
    assert k == len(data), name  # one frame per step, none left over


def _kernels_load(python: str) -> str | None:
    """None when vLLM's compiled kernels load in ``python``, else the error."""
    res = subprocess.run([python, "-c", "import vllm._C"], capture_output=True, text=True, timeout=300)
    if res.returncode == 0:
        return None
    return next((ln for ln in reversed(res.stderr.splitlines()) if "Error" in ln), res.stderr[-300:])


@pytest.mark.vllm_versions
@pytest.mark.parametrize("version", _releases())
def test_record_engine_under_the_release(version: str, tmp_path: Path):
    python = _python(version)
    if not TINY_A.is_dir():
        pytest.skip(f"no tiny model at {TINY_A}")
    err = _kernels_load(python)
    if err is not None:
        pytest.skip(f"vLLM {version} cannot run a model here: vllm._C does not load ({err})")
    _session_trace(tmp_path / "t")
    res = run_cli("record", "engine", tmp_path / "t", "--model", TINY_A, "--vllm-python", python,
                  "--out", tmp_path / "rec", "--warmup", "1", "--time-limit", "300")
    assert res.exit_code == 0, res.output + res.stderr
    eng = json.loads((tmp_path / "rec" / "engine.json").read_text())
    assert eng["vllm_version"] == version and eng["model"] == "tiny-a"
    req = pd.read_csv(tmp_path / "rec" / "requests.csv", keep_default_na=False)
    assert list(req["client_id"]) == [f"r{i}" for i in range(6)]
    assert (req["output_tokens"].to_numpy() == [12, 5, 8, 20, 6, 10]).all()
    assert int(req["cached_tokens"][2]) == 256 and int(req["cached_tokens"][4]) == 256
    assert run_cli("trace", "import", "vllm-record", tmp_path / "rec", "--out", tmp_path / "rt").exit_code == 0
