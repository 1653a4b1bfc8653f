"""Peer suite across vLLM releases: every stored record of every release
(``tests/peer/fixtures/<version>/``, ``tests/peer/releases.py``) against
the kernel, which follows one release (``releases.KERNEL_VERSION``).

Why: users run the vLLM they deployed, and the scheduler's rules moved
between releases; which moves change a batch is only known by running each
release's real scheduler on the same scenarios. The kernel's own release is
checked record by record in ``test_vllm_peer`` and ``test_async_peer``;
here each other release's record must either be that same record (then the
kernel agrees with it, as proven there) or agree with a fresh kernel run.
A pair that does not is listed in ``releases.EXPECTED_TO_DIFFER`` with the
vLLM change behind it: that list is the work left for version variants of
the engine, and it is strict (an entry that starts agreeing fails).

Regenerating a release's records needs its interpreter
(``LATROUTE_VLLM_PYTHON_0_28_0`` and the like): ``-m vllm_versions``,
skipped without it.
"""
from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import pytest

from tests.estimators.engine.test_async_peer import ASYNC_FIELDS
from tests.estimators.engine.test_vllm_peer import FIELDS, first_difference, load
from tests.peer import random_fixtures, releases
from tests.peer.latroute_side import run_scenario, run_scenario_async

KERNEL = releases.KERNEL_VERSION
OTHERS = [v for v in releases.versions() if v != KERNEL]


@functools.cache
def _random(version: str) -> dict[str, str]:
    """Release ``version``'s random records by name, each its JSON line with
    the release left out (two releases' lines are then equal iff they
    recorded the same); parsed only where needed, since the default suite
    reads every release's set."""
    out = {}
    for line in random_fixtures.read_text(releases.random_path(version)).splitlines():
        name = re.search(r'"name":"([^"]+)"', line).group(1)
        stamp = f'"vllm_version":"{version}"'
        assert stamp in line, f"{version}/random/{name} was not recorded by {version}"
        out[name] = line.replace(stamp, '"vllm_version":""', 1)
    return out


def records() -> list[tuple[str, str, str]]:
    """(release, mode, scenario) of every stored record of the other releases."""
    out = []
    for v in OTHERS:
        out += [(v, "sync", p.stem) for p in releases.sync_paths(v)]
        out += [(v, "async", p.stem) for p in releases.async_paths(v)]
        out += [(v, "random", name) for name in _random(v)]
    return out


def record(version: str, mode: str, name: str) -> dict:
    if mode == "random":
        return {**random_fixtures.unpack(_random(version)[name]), "vllm_version": version}
    return load(releases.folder(version) / ("async" if mode == "async" else "") / f"{name}.json")


def _body(version: str, mode: str, name: str) -> str:
    """The record less its release, as text to compare."""
    if mode == "random":
        return _random(version)[name]
    fx = record(version, mode, name)
    assert fx["vllm_version"] == version, f"{version}/{mode}/{name} says it was recorded by {fx['vllm_version']}"
    return json.dumps(releases.without_version(fx), sort_keys=True)


def distinct_records() -> list[tuple[str, str, tuple[str, ...]]]:
    """(mode, scenario, releases) for each record of another release that is
    not the kernel release's own, releases that recorded the same steps
    grouped: the kernel runs each distinct record once (the suite's time)."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for version, mode, name in records():
        body = _body(version, mode, name)
        if body != _body(KERNEL, mode, name):
            groups.setdefault((mode, name, body), []).append(version)
    return [(mode, name, tuple(vs)) for (mode, name, _), vs in groups.items()]


def kernel_difference(fx: dict, mode: str) -> str | None:
    """Where the kernel's run of fixture ``fx`` first differs from it (None: agrees)."""
    if mode == "sync":
        start, steps = run_scenario(fx, len(fx["steps"]))
        fields = FIELDS
    else:
        start, steps = run_scenario_async(fx, len(fx["steps"]))
        fields = ASYNC_FIELDS
    if start != fx["start"]["free_blocks"]:
        return f"free blocks at start: vLLM {fx['start']['free_blocks']}, kernel {start}"
    diff = first_difference(fx["steps"], steps, fields)
    if diff is None and sorted(r for st in steps for r in st["finished"]) != sorted(r["id"] for r in fx["requests"]):
        return "a request does not finish exactly once"
    return diff


DISTINCT = distinct_records()


def _param(mode: str, name: str, versions: tuple[str, ...]):
    reasons = {releases.EXPECTED_TO_DIFFER.get((v, mode, name)) for v in versions}
    assert len(reasons) == 1, f"{mode}/{name}: {versions} recorded the same steps but the table treats them apart"
    reason = reasons.pop()
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(mode, name, versions, id=f"{mode}/{name}@{'+'.join(versions)}", marks=marks)


@pytest.mark.parametrize(("mode", "name", "versions"), [_param(*d) for d in DISTINCT])
def test_kernel_agrees_with_every_release_record(mode: str, name: str, versions: tuple[str, ...]):
    """Each release's record that is not the kernel release's own agrees
    with a kernel run (the ones that are its own are checked by
    test_vllm_peer and test_async_peer)."""
    fx, own = record(versions[0], mode, name), record(KERNEL, mode, name)
    assert {k: own[k] for k in ("engine", "requests")} == {k: fx[k] for k in ("engine", "requests")}, \
        f"{versions[0]}/{mode}/{name} is not the scenario of {KERNEL}'s record of that name"
    diff = kernel_difference(fx, mode)
    assert diff is None, f"vLLM {', '.join(versions)}, {mode} {name}: {diff}"


def test_every_release_holds_every_scenario():
    """A release folder is whole: the kernel release's sync, async and
    random scenarios, each recorded by that release, nothing else."""
    assert KERNEL in releases.versions()
    names = {"sync": {p.stem for p in releases.sync_paths(KERNEL)},
             "async": {p.stem for p in releases.async_paths(KERNEL)},
             "random": set(_random(KERNEL))}
    for v in OTHERS:
        assert {p.stem for p in releases.sync_paths(v)} == names["sync"], v
        assert {p.stem for p in releases.async_paths(v)} == names["async"], v
        assert set(_random(v)) == names["random"], v


def test_expected_differences_name_stored_records_that_differ_with_a_reason():
    """The table lists exactly records that are not the kernel release's own
    (an entry for a record equal to it would be a pass the table calls a
    difference), each with the vLLM change behind it."""
    differing = {(v, mode, name) for mode, name, vs in DISTINCT for v in vs}
    for key, reason in releases.EXPECTED_TO_DIFFER.items():
        assert key in differing, f"{key}: not a stored record that differs from {KERNEL}'s"
        assert len(reason.split()) >= 5, f"{key}: say which vLLM change makes it differ"


def test_checked_versions_are_the_releases_whose_records_all_agree():
    """``CHECKED_VLLM_VERSIONS`` (what ``validate`` trusts) is exactly the
    stored releases with no record apart from the kernel release's own, and
    ends with the release the kernel follows (the fallback default)."""
    from traces.vllm_releases.versions import CHECKED_VLLM_VERSIONS

    apart = {v for _, _, vs in DISTINCT for v in vs}
    assert set(CHECKED_VLLM_VERSIONS) == set(releases.versions()) - apart
    assert CHECKED_VLLM_VERSIONS[-1] == KERNEL


def test_a_changed_record_is_run_through_the_kernel_and_caught():
    """The shortcut (same record as the kernel release's) cannot hide a
    difference: a record one free block off at one step is compared with a
    kernel run, which catches it at that step."""
    fx = load(releases.async_paths(KERNEL)[0].parent / "async_preempt_in_flight.json")
    assert kernel_difference(fx, "async") is None
    steps = [dict(st) for st in fx["steps"]]
    steps[3]["free_blocks"] += 1
    planted = {**fx, "vllm_version": "0.0.0", "steps": steps}
    assert releases.without_version(planted) != releases.without_version(fx)
    assert kernel_difference(planted, "async").startswith("step 4: free_blocks differs")


def test_python_variable_names_the_release():
    assert releases.python_variable("0.28.0") == "LATROUTE_VLLM_PYTHON_0_28_0"
    assert releases.versions() == sorted(releases.versions(), key=lambda v: tuple(map(int, v.split("."))))


@pytest.mark.vllm_versions
@pytest.mark.parametrize("version", releases.versions())
def test_release_regenerates_its_stored_records(version: str, tmp_path: Path):
    """vLLM ``version``'s real schedulers, rerun now under its interpreter,
    give its stored records byte for byte (a developer run: CI has no vLLM)."""
    var = releases.python_variable(version)
    python = os.environ.get(var)
    if not python:
        pytest.skip(f"{var} not set (the Python of an environment with vLLM {version})")
    status, err = releases.regenerate(python, tmp_path)
    assert status == 0, err
    assert releases.changed_files(version, tmp_path) == []
