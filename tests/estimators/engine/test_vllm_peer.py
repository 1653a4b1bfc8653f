"""Peer suite: vLLM's own scheduling scenarios, latroute's kernel against
vLLM's real scheduler.

Each fixture under ``tests/peer/fixtures/0.32.0`` holds one scenario taken from
vLLM's unit tests (``tests/peer/vllm_tests.tsv`` says which, and lists the
ones latroute cannot express with the reason) together with every step of
vLLM 0.32's real ``Scheduler`` running it (recorded by
``tests/peer/generate_fixtures.py`` in vLLM's environment). Here the same
scenario runs through latroute's ``vllm-v1`` kernel and must agree step by
step: the batch (request, tokens, computed tokens before), preemptions,
running and waiting queues, free KV blocks after scheduling and after the
step's outputs, and the requests that finished. (Other releases' records,
``tests/peer/fixtures/<version>``, are checked by ``test_vllm_release_peer``.)
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.peer import releases
from tests.peer.latroute_side import run_scenario

PEER = Path(__file__).resolve().parents[2] / "peer"
KERNEL = releases.folder(releases.KERNEL_VERSION)  # the records of the release the kernel follows
FIXTURES = releases.sync_paths(releases.KERNEL_VERSION)
CATALOGUE = PEER / "vllm_tests.tsv"
FIELDS = ("batch", "preempted", "running", "waiting", "free_blocks_scheduled", "finished", "free_blocks")

# Known disagreements, each tied to the work that removes it; strict, so the
# test fails loudly the day the kernel starts agreeing.
XFAIL: dict[str, str] = {}  # fixture name -> reason, for a known disagreement being worked on


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def _param(path: Path):
    fx = load(path)
    marks = []
    if fx["name"] in XFAIL:
        marks.append(pytest.mark.xfail(strict=True, reason=XFAIL[fx["name"]]))
    return pytest.param(path, id=fx["name"], marks=marks)


def first_difference(expected: list[dict], got: list[dict], fields: tuple[str, ...] = FIELDS) -> str | None:
    """The first step and field where two step logs differ, with both
    records, or None."""
    for want, have in zip(expected, got):
        for field in fields:
            if want[field] != have[field]:
                return (f"step {want['step']}: {field} differs\n  vLLM:     {json.dumps(want)}\n"
                        f"  latroute: {json.dumps(have)}")
    if len(expected) != len(got):
        return f"vLLM ran {len(expected)} steps, latroute {len(got)}"
    return None


@pytest.mark.parametrize("path", [_param(p) for p in FIXTURES])
def test_kernel_agrees_with_vllm_step_by_step(path: Path):
    fx = load(path)
    assert_agrees(fx, *run_scenario(fx, len(fx["steps"])))


def assert_agrees(fx: dict, start_free: int, steps: list[dict], fields: tuple[str, ...] = FIELDS) -> None:
    """The kernel's run of fixture ``fx`` is vLLM's, record for record, and
    finishes every request once."""
    assert start_free == fx["start"]["free_blocks"]
    diff = first_difference(fx["steps"], steps, fields)
    assert diff is None, f"{fx['name']} ({fx['source']['test']}): {diff}"
    finished = [rid for st in steps for rid in st["finished"]]
    assert sorted(finished) == sorted(r["id"] for r in fx["requests"]), "every request finishes once"


def catalogue() -> list[dict]:
    with CATALOGUE.open() as f:
        return list(csv.DictReader((line for line in f if not line.startswith("#")), delimiter="\t"))


def test_catalogue_and_fixtures_match():
    """Every vLLM test marked expressed names fixtures that exist and come
    from it; every fixture traces back to the catalogue or to latroute's own
    scenarios; skipped tests give a reason."""
    rows = catalogue()
    by_name = {load(p)["name"]: load(p) for p in FIXTURES}
    # async-specific scenarios (the async copies of the scenarios above are checked by test_async_peer)
    by_name.update({f"async/{fx['name']}": fx for fx in map(load, releases.async_paths(releases.KERNEL_VERSION))
                    if fx["name"] not in by_name})
    assert len({(r["file"], r["test"]) for r in rows}) == len(rows), "a test is listed twice"
    used = set()
    for r in rows:
        assert r["status"] in ("expressed", "skipped"), r
        if r["status"] == "skipped":
            assert r["detail"].strip(), f"{r['test']}: skipped without a reason"
            continue
        names = r["detail"].split()
        assert names, r
        for n in names:
            assert n in by_name, f"{r['test']}: no fixture {n}"
            assert by_name[n]["source"] == {"file": r["file"], "test": r["test"]}, n
        used.update(names)
    own = {n for n, fx in by_name.items() if fx["source"]["file"].startswith("latroute")}
    assert set(by_name) == used | own
    assert {fx["vllm_version"] for fx in by_name.values()} == {releases.KERNEL_VERSION}


def test_divergence_report_names_step_and_field():
    """The comparison can fail: a changed free-block count is caught at its step."""
    fx = load(KERNEL / "kv_gate_head_of_line.json")
    _, steps = run_scenario(fx, len(fx["steps"]))
    steps[2] = {**steps[2], "free_blocks": steps[2]["free_blocks"] + 1}
    assert first_difference(fx["steps"], steps).startswith("step 3: free_blocks differs")
