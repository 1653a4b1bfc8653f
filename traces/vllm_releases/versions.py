"""Which vLLM versions the scheduler kernel was checked against, and the
window of releases whose scheduling rules it follows.

The kernel reimplements vLLM V1's scheduling rules; every recorded batch of
``shared/data/vllm_cpu`` (vLLM 0.32.0) is reproduced. A release is listed
here when the peer suite's records of it (``tests/peer/fixtures/<version>``,
every sync, async and random scenario) all agree step by step with the
kernel at that release's rules. The rules of any release from the oldest
listed to any patch of the newest listed minor release are known
(``WINDOW``); an instance names the release it follows (``vllm_version``).

A version outside the window has rules nobody checked, so the importers
refuse it by name unless the user accepts it as unmodelled (it is then
replayed with the nearest end of the window, ``nearest_in_window``), and
``validate`` warns on a recording of one instead of letting a
decision-agreement figure below 100% look like a kernel bug. A request log
that names no vLLM version is replayed with the newest checked release's
rules (``NEWEST_CHECKED``), marked as a default.

The data layer imports no engine, so the window is spelled out in the data
layer as well as in ``estimators.engine.releases``: once, in
``traces.vllm_recorder.release`` (the recorder runs in vLLM's interpreter,
standard library only, and checks it there too); a test checks that the
two agree on a range of version strings.
"""
from __future__ import annotations

from traces.vllm_recorder.release import WINDOW, in_window, version_key  # noqa: F401 (the window, read here)

CHECKED_VLLM_VERSIONS = ("0.19.0", "0.22.1", "0.25.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")  # oldest first: the last is the fallback default
NEWEST_CHECKED = CHECKED_VLLM_VERSIONS[-1]  # the rules the kernel follows by default


def nearest_in_window(version: str | None) -> str:
    """The release whose rules replay ``version``: itself inside the window, the nearest end outside it,
    the newest checked release when it is no version at all."""
    key = version_key(version) if version is not None else None
    if key is None:
        return NEWEST_CHECKED
    if in_window(version):
        return str(version).strip()
    return WINDOW[0] if key < version_key(WINDOW[0]) else NEWEST_CHECKED


def window_text() -> str:
    return f"{WINDOW[0]} to {WINDOW[1]}.x"


def unchecked_version_warning(meta: dict) -> str | None:
    """A warning when the trace is a recording of a vLLM version outside the window (None for other
    traces and versions inside it)."""
    src = meta.get("source") or {}
    if src.get("kind") != "vllm-record":
        return None
    version = src.get("vllm_version")
    if isinstance(version, str) and in_window(version):
        return None
    shown = f"vLLM {version}" if version else "a vLLM of unknown version"
    return (f"warning: recorded with {shown}, outside the releases whose scheduling rules latroute checked "
            f"({window_text()}): replayed with {nearest_in_window(version if isinstance(version, str) else None)}'s "
            "rules, so a decision agreement below 100% may be the release's rules, not a kernel bug")
