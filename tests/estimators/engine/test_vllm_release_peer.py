"""Peer suite across vLLM releases: every stored record of every release
(``tests/peer/fixtures/<version>/``, ``tests/peer/releases.py``) against
the kernel at that release's rules (``InstanceConfig.vllm_version``,
``estimators.engine.releases``).

Why: users run the vLLM they deployed, and the scheduler's rules moved
between releases; which moves change a batch is only known by running each
release's real scheduler on the same scenarios. The kernel's own release is
checked record by record in ``test_vllm_peer`` and ``test_async_peer``;
here each other release's record must either be that same record (then the
kernel agrees with it, as proven there, since no rule change moves it) or
agree with a fresh kernel run at its release's rules.
The records that differ from 0.32.0's are listed by the rule change that
moves them (``releases.MOVED``), and running one at the rules of the other
side of its change must fail: a swap of two releases' rules cannot pass.

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
    """(mode, scenario, releases) for each record of another release that
    the kernel's own tests do not already run at the same rules: a record
    unlike the kernel release's, or like it but under older rules (which
    must then leave it unmoved). Releases with the same steps and the same
    rules are grouped: the kernel runs each group once (the suite's time)."""
    from estimators.engine.releases import rules_of

    groups: dict[tuple[str, str, str, int], list[str]] = {}
    for version, mode, name in records():
        body = _body(version, mode, name)
        if body != _body(KERNEL, mode, name) or rules_of(version) != 0:
            groups.setdefault((mode, name, body, rules_of(version)), []).append(version)
    return [(mode, name, tuple(vs)) for (mode, name, _, _), vs in groups.items()]


def kernel_difference(fx: dict, mode: str, rules: str | None = None) -> str | None:
    """Where the kernel's run of fixture ``fx``, at the rules of the release
    that recorded it (or of ``rules``), first differs from it (None: agrees)."""
    if mode == "sync":
        start, steps = run_scenario(fx, len(fx["steps"]), rules=rules)
        fields = FIELDS
    else:
        start, steps = run_scenario_async(fx, len(fx["steps"]), rules=rules)
        fields = ASYNC_FIELDS
    if start != fx["start"]["free_blocks"]:
        return f"free blocks at start: vLLM {fx['start']['free_blocks']}, kernel {start}"
    diff = first_difference(fx["steps"], steps, fields)
    if diff is None and sorted(r for st in steps for r in st["finished"]) != sorted(r["id"] for r in fx["requests"]):
        return "a request does not finish exactly once"
    return diff


DISTINCT = distinct_records()


@pytest.mark.parametrize(("mode", "name", "versions"),
                         [pytest.param(*d, id=f"{d[0]}/{d[1]}@{'+'.join(d[2])}") for d in DISTINCT])
def test_kernel_agrees_with_every_release_record(mode: str, name: str, versions: tuple[str, ...]):
    """Each release's record agrees with a kernel run at that release's
    rules (the kernel release's own records, and records equal to them
    under the same rules, are checked by test_vllm_peer and
    test_async_peer)."""
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


def test_the_records_that_differ_are_the_ones_a_rule_change_moves():
    """A stored record differs from 0.32.0's exactly when a listed rule
    change moves it, and the changes listed are the engine's own
    (``estimators.engine.releases.RULE_CHANGES``): the table cannot call a
    record moved that is not, nor miss one."""
    from estimators.engine.releases import KERNEL_VERSION, RULE_CHANGES

    differing = {(v, mode, name) for v, mode, name in records() if _body(v, mode, name) != _body(KERNEL, mode, name)}
    assert differing == set(releases.MOVED_RECORDS)
    assert sorted(m.since for m in releases.MOVED) == sorted(c.since for c in RULE_CHANGES)
    assert releases.KERNEL_VERSION == KERNEL_VERSION


def test_checked_versions_are_the_stored_releases():
    """``CHECKED_VLLM_VERSIONS`` (what ``validate`` trusts) is exactly the
    stored releases, every record of which agrees with the kernel at its
    release's rules (above), and ends with the release the kernel follows
    by default."""
    from traces.vllm_releases.versions import CHECKED_VLLM_VERSIONS

    assert list(CHECKED_VLLM_VERSIONS) == releases.versions()
    assert CHECKED_VLLM_VERSIONS[-1] == KERNEL


def _sides(since: str) -> tuple[str, str]:
    """The newest stored release before ``since`` and the oldest from it."""
    vs, key = releases.versions(), releases._version_key
    return [v for v in vs if key(v) < key(since)][-1], [v for v in vs if key(v) >= key(since)][0]


PLANTED = [(m.since, x) for m in releases.MOVED
           for x in [y for y in m.scenarios if not y.startswith("random/")]
           + [y for y in m.scenarios if y.startswith("random/")][:3]]


@pytest.mark.parametrize(("since", "scenario"), PLANTED, ids=[f"{a}:{b}" for a, b in PLANTED])
def test_a_planted_rule_swap_fails(since: str, scenario: str):
    """A moved record run at the rules of the release on the other side of
    its change (the older release's record at the newer rules, the newer
    one's at the older rules) disagrees with it: the suite fails if the
    engine swaps the two releases' rules."""
    older, newer = _sides(since)
    mode, name = scenario.split("/")
    both = releases.MOVED_RECORDS[(older, mode, name)]
    if len(both) > 1:  # moved by two changes: the newer side is past both
        newer = _sides(max(both, key=releases._version_key))[1]
    assert kernel_difference(record(older, mode, name), mode, rules=newer) is not None
    assert kernel_difference(record(newer, mode, name), mode, rules=older) is not None


def test_a_changed_record_is_run_through_the_kernel_and_caught():
    """The shortcut (same record as the kernel release's) cannot hide a
    difference: a record one free block off at one step is compared with a
    kernel run, which catches it at that step."""
    fx = load(releases.async_paths(KERNEL)[0].parent / "async_preempt_in_flight.json")
    assert kernel_difference(fx, "async") is None
    steps = [dict(st) for st in fx["steps"]]
    steps[3]["free_blocks"] += 1
    planted = {**fx, "vllm_version": "0.31.0", "steps": steps}
    assert releases.without_version(planted) != releases.without_version(fx)
    assert kernel_difference(planted, "async").startswith("step 4: free_blocks differs")


@pytest.mark.docs
def test_the_release_page_shows_the_matrix_its_command_prints():
    """docs/reference/vllm-releases.md holds the table ``python -m
    tests.peer.matrix`` prints now (a result comes out of its command)."""
    from tests.conftest import REPO
    from tests.peer import matrix

    page = (REPO / "docs" / "reference" / "vllm-releases.md").read_text()
    assert "python -m tests.peer.matrix" in page
    assert matrix.table() in page


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
