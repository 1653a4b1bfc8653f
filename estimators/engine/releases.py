"""Which vLLM release's scheduling rules an instance follows.

Users run the vLLM they deployed, and its scheduler moved between
releases. The peer suite records every release of the window 0.19 to 0.32
step by step (``tests/peer/fixtures/<version>/``); diffing adjacent
releases' records, and patching one rule into the older release until it
records the newer one's steps, found the two changes below that move a
batch (``docs/reference/vllm-releases.md`` cites the code). Everything else
that changed in the window either concerns what the kernel does not model
or leaves every record as it was, so a version's rules are the newest
rules less the changes it predates: a bit each in the kernel's ``cfg``
(``C_RULES``), read where the rule applies, inside the one step loop.

Why a window and not any version: outside it nobody ran the release's own
scheduler against the kernel, so its rules are not known; a version before
0.19.0 or after 0.32 is refused by name (``InstanceConfig``), and the
importers refuse it unless the user accepts it as unmodelled
(``--accept-unmodelled vllm_version``; it is then replayed with the
nearest end of the window, said so). The data layer spells the same window
out (``traces.vllm_releases.versions``, which imports no engine; a test
checks that they agree).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

KERNEL_VERSION = "0.32.0"  # the release whose rules the kernel follows with no bit set (the default)
WINDOW = ("0.19.0", "0.32")  # oldest release checked, newest minor release checked (any of its patches)

# rule bits of cfg[C_RULES]: a release before ``since`` follows the older rule
R_LONE_PREFILL_CAP = 1  # a lone request's prefill is capped by long_prefill_token_threshold too
R_FREE_ALL_TO_TAIL = 2  # every freed block joins the free queue's tail, hashed or not


@dataclass(frozen=True)
class RuleChange:
    """One change of vLLM's scheduling rules that moves a batch: releases
    before ``since`` follow the older rule (``older``), marked by ``bit``."""

    since: str
    bit: int
    older: str
    source: str  # the newer rule's code, at the release that brought it


RULE_CHANGES = (
    RuleChange("0.24.0", R_FREE_ALL_TO_TAIL,
               "a request's freed blocks all join the free queue's tail in eviction order (from 0.24.0 the ones "
               "without a hash go to its head, reused first)",
               "https://github.com/vllm-project/vllm/blob/v0.24.0/vllm/v1/core/block_pool.py"),
    RuleChange("0.31.0", R_LONE_PREFILL_CAP,
               "long_prefill_token_threshold caps every prefill chunk (from 0.31.0 the only running or waiting "
               "request may use the whole token budget)",
               "https://github.com/vllm-project/vllm/blob/v0.31.0/vllm/v1/core/sched/scheduler.py"),
)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def version_key(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of a vLLM version ("0.19.1", "v0.10.1.1",
    "0.32.0+cpu", "0.11.0rc1": the leading numbers); None when it is not one."""
    m = _VERSION.match(str(version).strip())
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def in_window(version: str) -> bool:
    """A release whose rules the kernel knows: 0.19.0 up to any 0.32 patch."""
    key = version_key(version)
    return key is not None and version_key(WINDOW[0]) <= key and key[:2] <= version_key(WINDOW[1])[:2]


def nearest_in_window(version: str) -> str:
    """The end of the window nearest a release outside it (the rules an
    accepted unmodelled version is replayed with); the version itself inside."""
    key = version_key(version)
    if key is None:
        raise ValueError(f"{version!r} is not a vLLM version")
    if in_window(version):
        return version
    return WINDOW[0] if key < version_key(WINDOW[0]) else KERNEL_VERSION


def rules_of(version: str) -> int:
    """The ``cfg[C_RULES]`` bits of a release in the window."""
    key = version_key(version)
    return sum(change.bit for change in RULE_CHANGES if key < version_key(change.since))


def window_text() -> str:
    return f"{WINDOW[0]} to {WINDOW[1]}.x"
