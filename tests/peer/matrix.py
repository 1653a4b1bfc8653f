"""The release matrix: for each stored vLLM release, its records, the rules
the kernel takes for it, and how many of its records the kernel reproduces
step by step at those rules.

Why a command: the table in ``docs/reference/vllm-releases.md`` is a
result, and a result names the command that regenerates it. It reads only
the stored records (no vLLM), runs each distinct (record, rules) pair
through the kernel once, and prints the table in the page's format::

    python -m tests.peer.matrix

A docs check (``-m docs``) requires the page's table to be this output.
"""
from __future__ import annotations

from estimators.engine.releases import RULE_CHANGES, rules_of
from tests.estimators.engine.test_vllm_release_peer import KERNEL, _body, _random, kernel_difference, record
from tests.peer import releases

HEADER = ("| release | records (sync / async / random) | same as 0.32.0 | moved by a rule change "
          "| rules the kernel takes | agree with the kernel |\n|---|---|---|---|---|---|")


def names(version: str) -> list[tuple[str, str]]:
    """(mode, scenario) of every stored record of ``version``."""
    return ([("sync", p.stem) for p in releases.sync_paths(version)]
            + [("async", p.stem) for p in releases.async_paths(version)]
            + [("random", name) for name in _random(version)])


def rules_text(version: str) -> str:
    """The rules ``rules_of`` gives ``version``, in words."""
    older = [c.since for c in RULE_CHANGES if rules_of(version) & c.bit]
    return "0.32.0's" if not older else "0.32.0's without " + " and ".join(f"{s}'s change" for s in older)


def rows() -> list[str]:
    """One table row per stored release, oldest first."""
    verdict: dict[tuple[str, str, str, int], bool] = {}  # a record's steps under some rules: run once
    out = []
    for version in releases.versions():
        mine = names(version)
        count = {mode: sum(1 for m, _ in mine if m == mode) for mode in ("sync", "async", "random")}
        same = sum(1 for m, n in mine if _body(version, m, n) == _body(KERNEL, m, n))
        moved = [k for k in releases.MOVED_RECORDS if k[0] == version]
        since = sorted({s for k in moved for s in releases.MOVED_RECORDS[k]}, key=releases._version_key)
        agree = 0
        for m, n in mine:
            key = (m, n, _body(version, m, n), rules_of(version))
            if key not in verdict:
                verdict[key] = kernel_difference(record(version, m, n), m) is None
            agree += verdict[key]
        moved_text = f"{len(moved)} (" + ", ".join(f"the {s} change" for s in since) + ")" if moved else "0"
        out.append(f"| {version} | {count['sync']} / {count['async']} / {count['random']} | {same} | {moved_text} "
                   f"| {rules_text(version)} | {agree} of {len(mine)} |")
    return out


def table() -> str:
    return "\n".join([HEADER, *rows()])


if __name__ == "__main__":
    print(table())
