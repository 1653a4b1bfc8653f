"""Which vLLM versions the scheduler kernel was checked against.

The kernel reimplements vLLM V1's scheduling rules; every recorded batch of
``shared/data/vllm_cpu`` (vLLM 0.32.0) is reproduced. A release is listed
here when the peer suite's records of it (``tests/peer/fixtures/<version>``,
every sync, async and random scenario) all agree step by step with the
kernel; the newest is the one the kernel follows. A recording from another
version may follow other rules (``docs/reference/vllm-releases.md`` lists
the ones found), so ``validate`` says so instead of letting a
decision-agreement figure below 100% look like a kernel bug.
A request log that names no vLLM version is given the newest checked
version's defaults (``traces.vllm_releases.defaults``).
"""
from __future__ import annotations

CHECKED_VLLM_VERSIONS = ("0.19.0", "0.22.1", "0.25.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")  # oldest first: the last is the fallback default


def unchecked_version_warning(meta: dict) -> str | None:
    """A warning when the trace is a recording of an unchecked vLLM version
    (None for other traces and checked versions)."""
    src = meta.get("source") or {}
    if src.get("kind") != "vllm-record":
        return None
    version = src.get("vllm_version")
    if version in CHECKED_VLLM_VERSIONS:
        return None
    return (f"warning: recorded with vLLM {version or 'of unknown version'}; the scheduler kernel was checked "
            f"against {', '.join(CHECKED_VLLM_VERSIONS)} only")
