"""vLLM's documented engine defaults, per vLLM version and GPU class.

A request log rarely states its engine's configuration. What vLLM did
with a setting nobody gave is not a guess: ``EngineArgs`` fills it from a
table keyed by the usage context (``vllm serve`` is ``OPENAI_API_SERVER``)
and by the device, and that table changed between releases. This module
holds that table for the releases read (each row names the file and line
of vLLM's source at the release's tag), the GPU classes it tells apart,
and the rule for a version or a GPU the trace does not state:

- a version not tabulated takes the newest tabulated release at or before
  it (said so);
- with no version, the run's date bounds it: no server ran a release
  published after the run, so the newest tabulated release published by
  then is inferred (``Release.published``, from PyPI); with neither, the
  version is defaulted to ``FALLBACK_VERSION`` (these are the defaults'
  release only: the scheduling rules of a trace that states no version
  are the newest checked release's, ``traces.importers.engine_settings``);
- an unknown GPU takes vLLM's own fallback when it cannot query the
  device: the row for "other GPUs" (the code says so in a comment).

``docs/reference/engine-defaults.md`` prints the table
(``tests/traces/importers/test_import_settings.py`` checks the page against it). The
fallback version is the one the scheduler kernel was checked against
(``traces.vllm_releases.versions``). The importers and the harness both read it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from traces.vllm_releases.versions import CHECKED_VLLM_VERSIONS

FALLBACK_VERSION = CHECKED_VLLM_VERSIONS[-1]
NO_VERSION = "the source states no vLLM version"
USAGE_CONTEXT = "vllm serve (usage context OPENAI_API_SERVER)"
TREE = "https://github.com/vllm-project/vllm/blob/v{v}/{path}"


@dataclass(frozen=True)
class GpuClass:
    """A class of GPUs that vLLM's default table does not tell apart."""

    key: str
    label: str
    memory_gib: float | None  # as torch reports the device's total memory; None: not known
    a100: bool = False  # vLLM >= 0.10 keeps A100s in the small row whatever their memory (PR #17885)


# device-name patterns, most specific first: (regex on the lower-cased name, key, label, GiB, a100)
_GPUS: tuple[tuple[str, str, str, float | None, bool], ...] = (
    (r"\b(gb|b)(200|300)\b", "b200", "B200/B300", 178.0, False),
    (r"gh200", "h100", "GH200 (96 GB)", 95.0, False),
    (r"h200", "h100", "H200 (141 GB)", 140.0, False),
    (r"h100|h800", "h100", "H100 (80 GB)", 79.6, False),
    (r"rtx\s*pro\s*6000|rtxpro6000", "h100", "RTX PRO 6000 (96 GB)", 94.6, False),
    (r"standard_nd96amsr_a100_v4", "a100-80", "A100 80 GB (Azure ND96amsr A100 v4: 8 per VM)", 80.0, True),
    (r"standard_nd96asr_v4", "a100-40", "A100 40 GB (Azure ND96asr v4: 8 per VM)", 40.0, True),
    (r"a100.*80\s*gb|a100-80|a100.*80g", "a100-80", "A100 80 GB", 80.0, True),
    (r"a100.*40\s*gb|a100-40|a100.*40g", "a100-40", "A100 40 GB", 40.0, True),
    (r"a100", "a100-40", "A100 (memory not stated: 40 GB taken)", 40.0, True),
    (r"l40s|\bl40\b", "l40s", "L40S/L40 (48 GB)", 44.4, False),
    (r"\bl4\b|nvidia-l4|a10g|\ba10\b", "l40s", "L4/A10 (24 GB)", 22.0, False),
    (r"5090", "consumer", "GeForce RTX 5090 (32 GB)", 31.4, False),
    (r"4090|3090", "consumer", "GeForce RTX 4090/3090 (24 GB)", 23.5, False),
    (r"geforce|rtx", "consumer", "GeForce/RTX (under 70 GB)", 24.0, False),
)
UNKNOWN_GPU = GpuClass("unknown", "not stated", None)
CLASS_LABELS = {"b200": "B200/B300 (>= 160 GiB)", "h100": "H100/H200 (>= 70 GiB, not A100)",
                "a100-80": "A100 80 GB", "a100-40": "A100 40 GB", "l40s": "L4/L40S (datacenter, < 70 GiB)",
                "consumer": "consumer GPUs (GeForce, < 70 GiB)", "unknown": "GPU not stated"}


def gpu_class(name: str | None) -> GpuClass:
    """The class of a device name as logs spell it ("NVIDIA-H100-80GB-HBM3", "NVIDIA GeForce RTX 4090",
    an Azure VM size); ``UNKNOWN_GPU`` when nothing matches."""
    text = str(name or "").lower()
    for pattern, key, label, gib, a100 in _GPUS:
        if re.search(pattern, text):
            return GpuClass(key, label, gib, a100)
    return UNKNOWN_GPU


@dataclass(frozen=True)
class Release:
    """One tabulated vLLM release: its batch-default rule and where each default is written."""

    version: str
    tiers: tuple[tuple[float, bool, int, int], ...]  # (min GiB, A100 excluded, budget, seqs) for vllm serve
    small: tuple[int, int]  # the row for other GPUs, and for a device vLLM could not query
    async_default: bool  # on a GPU, when no option says otherwise
    batch_source: str  # path#line of the device table
    async_source: str  # where SchedulerConfig has (or, before 0.10, lacks) async_scheduling
    block_source: str
    published: str  # the day its first file reached PyPI (UTC): no run before it used it


RELEASES: tuple[Release, ...] = (
    Release("0.8.5", ((70.0, False, 8192, 1024),), (2048, 256), False,
            "vllm/engine/arg_utils.py#L1596", "vllm/config.py#L1821",
            "vllm/platforms/cuda.py#L142", "2025-04-28"),
    Release("0.10.1.1", ((70.0, True, 8192, 1024),), (2048, 256), False,
            "vllm/engine/arg_utils.py#L1638", "vllm/config/scheduler.py#L155", "vllm/platforms/cuda.py",
            "2025-08-20"),
    Release("0.19.0", ((70.0, True, 8192, 1024),), (2048, 256), True,
            "vllm/engine/arg_utils.py#L2053", "vllm/config/vllm.py#L755", "vllm/config/cache.py#L34",
            "2026-04-03"),
    Release("0.32.0", ((160.0, False, 16384, 1024), (70.0, True, 8192, 1024)), (2048, 256), True,
            "vllm/engine/arg_utils.py#L2923", "vllm/config/vllm.py#L1585", "vllm/config/cache.py#L72",
            "2026-10-18"),
)
BY_VERSION = {r.version: r for r in RELEASES}


def _key(version: str) -> tuple[int, ...] | None:
    m = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(version).strip())
    return tuple(int(x) for x in m.groups() if x is not None) if m else None


@dataclass(frozen=True)
class VersionChoice:
    """The release whose defaults apply, and how it was chosen."""

    release: Release
    stated: str | None
    how: str
    inferred: bool = False  # from the run's date, not stated


def release_for(version: str | None, run_date: str | None = None) -> VersionChoice:
    """The tabulated release for a trace's vLLM version (see the module docstring for the rule). With no
    version but the run's date (``YYYY-MM-DD``), the newest tabulated release published by then: the
    server cannot have run a later one."""
    if (version is None or _key(version) is None) and run_date:
        why = NO_VERSION if version is None else f"{version!r} is not a version number"
        by_then = [r for r in RELEASES if r.published <= run_date]
        later = [r for r in RELEASES if r.published > run_date]
        if by_then:
            r = by_then[-1]
            after = f"; {later[0].version} was published {later[0].published}" if later else ""
            return VersionChoice(r, None, f"{why}; a run on {run_date} ran no release published later: "
                                          f"{r.version}'s defaults, the newest tabulated release by then "
                                          f"(published {r.published}{after})", True)
        r = RELEASES[0]
        return VersionChoice(r, None, f"{why}; a run on {run_date} predates every tabulated release: "
                                      f"{r.version}'s defaults, the oldest (published {r.published})", True)
    if version is None or _key(version) is None:
        why = NO_VERSION if version is None else f"{version!r} is not a version number"
        return VersionChoice(BY_VERSION[FALLBACK_VERSION], None,
                             f"{why}: {FALLBACK_VERSION} taken, the release latroute's scheduler kernel follows")
    key = _key(version)
    if version in BY_VERSION:
        return VersionChoice(BY_VERSION[version], version, f"vLLM {version}")
    earlier = [r for r in RELEASES if _key(r.version) <= key]
    if earlier:
        r = earlier[-1]
        return VersionChoice(r, version, f"vLLM {version} is not tabulated: {r.version}'s defaults, the newest "
                                         "tabulated release before it")
    r = RELEASES[0]
    return VersionChoice(r, version, f"vLLM {version} is older than every tabulated release: {r.version}'s defaults")


@dataclass(frozen=True)
class Default:
    value: object
    source: str  # where it is written: a URL at the release's tag, with the rule


def batch_defaults(release: Release, gpu: GpuClass) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, which row) for ``vllm serve`` on this GPU."""
    if gpu.memory_gib is None:
        return (*release.small, "the row vLLM takes when it cannot query the device")
    for min_gib, a100_excluded, budget, seqs in release.tiers:
        if gpu.memory_gib >= min_gib and not (a100_excluded and gpu.a100):
            return budget, seqs, (f">= {min_gib:g} GiB" + (", not an A100" if a100_excluded else ""))
    return (*release.small, "other GPUs")


def engine_defaults(release: Release, gpu: GpuClass) -> dict[str, Default]:
    """The engine settings vLLM ``release`` gives a ``vllm serve`` on ``gpu`` when nobody sets them."""
    url = lambda path: TREE.format(v=release.version, path=path)  # noqa: E731
    budget, seqs, row = batch_defaults(release, gpu)
    where = (f"vLLM {release.version}'s default for {USAGE_CONTEXT} on {gpu.label} ({row}): "
             f"{url(release.batch_source)}")
    return {
        "max_num_batched_tokens": Default(budget, where),
        "max_num_seqs": Default(seqs, where),
        "block_size": Default(16, f"vLLM {release.version}'s CUDA default block size: {url(release.block_source)}"),
        "chunked_prefill": Default(True, f"vLLM {release.version} V1: chunked prefill on for generative models"),
        "prefix_caching": Default(True, f"vLLM {release.version} V1: prefix caching on for generative models"),
        "async_scheduling": Default(release.async_default,
                                    f"vLLM {release.version} on a GPU: async scheduling "
                                    f"{'on unless an option forbids it' if release.async_default else 'off'}: "
                                    f"{url(release.async_source)}"),
        "long_prefill_token_threshold": Default(0, f"vLLM {release.version}'s SchedulerConfig default (off)"),
        "tensor_parallel_size": Default(1, f"vLLM {release.version}'s ParallelConfig default"),
        "pipeline_parallel_size": Default(1, f"vLLM {release.version}'s ParallelConfig default"),
        "data_parallel_size": Default(1, f"vLLM {release.version}'s ParallelConfig default"),
    }


def table_rows() -> list[tuple[str, str, int, int, bool]]:
    """(release, GPU class, budget, max_num_seqs, async) for every release and class: the docs table."""
    rows = []
    for r in RELEASES:
        for key in ("b200", "h100", "a100-80", "a100-40", "l40s", "consumer", "unknown"):
            gpu = _class_example(key)
            budget, seqs, _ = batch_defaults(r, gpu)
            rows.append((r.version, CLASS_LABELS[key], budget, seqs, r.async_default))
    return rows


def _class_example(key: str) -> GpuClass:
    for _, k, label, gib, a100 in _GPUS:
        if k == key:
            return GpuClass(k, label, gib, a100)
    return UNKNOWN_GPU
