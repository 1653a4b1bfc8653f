"""The peer fixtures per vLLM release: where each release's records are
stored, which interpreter regenerates them, and which (release, scenario)
pairs a change of vLLM's rules moves.

Why per release: latroute's kernel follows vLLM 0.32's scheduler
(``KERNEL_VERSION``) and, as variants, the older rules of each release in
the window (``estimators.engine.releases``); users run what they deployed,
and the scheduler's rules moved between releases. Each release's fixtures are recorded by
``generate_fixtures.py`` under that release's own interpreter and kept in
``fixtures/<version>/`` (same layout in every folder: the sync scenarios as
``NAME.json``, the async ones in ``async/``, the random async set in
``async_random.jsonl.gz``), so the default suite can compare every release
with the kernel without any vLLM installed, and ``git diff`` between two
folders shows what a release changed.

The interpreter of release X.Y.Z is named by the environment variable
``LATROUTE_VLLM_PYTHON_X_Y_Z`` (e.g. ``LATROUTE_VLLM_PYTHON_0_28_0``); no
path is written here. Standard library only: the generator imports nothing
of latroute.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# the release whose scheduler the kernel follows (the last of traces.vllm_releases.versions.CHECKED_VLLM_VERSIONS)
KERNEL_VERSION = "0.32.0"


@dataclass(frozen=True)
class MovedRecords:
    """The stored records a change of vLLM's scheduling rules moves: every
    stored release before ``since`` records ``scenarios`` ("mode/name", mode
    sync, async or random) differently from the releases after it. Found by
    diffing the records of adjacent releases and shown by
    ``attribute_rule_change.py`` (the older release with only this rule
    patched in records the newer one's steps); the engine follows the
    older rule for those releases (``estimators.engine.releases.RULE_CHANGES``,
    whose ``since`` each entry here names), and
    ``docs/reference/vllm-releases.md`` cites the code."""

    since: str
    scenarios: tuple[str, ...]


MOVED = (
    MovedRecords(
        since="0.24.0",  # freed blocks without a hash go to the free queue's head
        scenarios=(
            "async/async_mixed_pressure_apc", "random/rand_004", "random/rand_007", "random/rand_017",
            "random/rand_027", "random/rand_029", "random/rand_030", "random/rand_062", "random/rand_065",
            "random/rand_085", "random/rand_093", "random/rand_094", "random/rand_099", "random/rand_100",
            "random/rand_101", "random/rand_102", "random/rand_107", "random/rand_118", "random/rand_124",
            "random/rand_129", "random/rand_130", "random/rand_135", "random/rand_140", "random/rand_141",
            "random/rand_165", "random/rand_168", "random/rand_170", "random/rand_187", "random/rand_189",
            "random/rand_190", "random/rand_197", "random/rand_199", "random/rand_215", "random/rand_234"

        ),
    ),
    MovedRecords(
        since="0.31.0",  # a lone request is no longer capped by long_prefill_token_threshold
        scenarios=(
            "sync/lone_request_exemption", "async/async_arrivals_each_step", "async/async_mixed_pressure_apc",
            "async/lone_request_exemption", "random/rand_003", "random/rand_006", "random/rand_010",
            "random/rand_011", "random/rand_016", "random/rand_022", "random/rand_028", "random/rand_038",
            "random/rand_041", "random/rand_048", "random/rand_050", "random/rand_051", "random/rand_054",
            "random/rand_055", "random/rand_059", "random/rand_061", "random/rand_063", "random/rand_066",
            "random/rand_071", "random/rand_077", "random/rand_080", "random/rand_084", "random/rand_090",
            "random/rand_091", "random/rand_095", "random/rand_097", "random/rand_102", "random/rand_103",
            "random/rand_105", "random/rand_113", "random/rand_117", "random/rand_124", "random/rand_125",
            "random/rand_133", "random/rand_134", "random/rand_140", "random/rand_144", "random/rand_146",
            "random/rand_148", "random/rand_155", "random/rand_156", "random/rand_161", "random/rand_165",
            "random/rand_169", "random/rand_171", "random/rand_172", "random/rand_177", "random/rand_183",
            "random/rand_186", "random/rand_188", "random/rand_191", "random/rand_195", "random/rand_197",
            "random/rand_198", "random/rand_199", "random/rand_200", "random/rand_205", "random/rand_212",
            "random/rand_219", "random/rand_226", "random/rand_227", "random/rand_228", "random/rand_235",
            "random/rand_238"

        ),
    ),
)


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


def moved_records(stored: list[str]) -> dict[tuple[str, str, str], list[str]]:
    """(release, mode, scenario) -> the ``since`` of each ``MOVED`` entry
    that moves that release's record: every stored release older than it."""
    out: dict[tuple[str, str, str], list[str]] = {}
    for change in MOVED:
        for version in stored:
            if _version_key(version) >= _version_key(change.since):
                continue
            for scenario in change.scenarios:
                mode, name = scenario.split("/")
                out.setdefault((version, mode, name), []).append(change.since)
    return out


def python_variable(version: str) -> str:
    """The environment variable naming release ``version``'s interpreter."""
    return "LATROUTE_VLLM_PYTHON_" + version.replace(".", "_")


def folder(version: str) -> Path:
    return FIXTURES / version


def versions() -> list[str]:
    """Every release with stored fixtures, oldest first."""
    found = [p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name[:1].isdigit()]
    return sorted(found, key=_version_key)


def sync_paths(version: str) -> list[Path]:
    return sorted(folder(version).glob("*.json"))


def async_paths(version: str) -> list[Path]:
    return sorted((folder(version) / "async").glob("*.json"))


PRIORITY = "priority"  # the priority-policy scenarios, sync and async (its async/): the kernel release's only


def priority_paths(version: str, mode: str) -> list[Path]:
    """The priority-policy records of ``version`` (``generate_fixtures.py
    --mode priority``), ``mode`` sync or async."""
    return sorted((folder(version) / PRIORITY / ("async" if mode == "async" else "")).glob("*.json"))


RANDOM_NAME = "async_random.jsonl.gz"  # the random async set, one file per release (random_fixtures)


def random_path(version: str) -> Path:
    return folder(version) / RANDOM_NAME


def without_version(fx: dict) -> dict:
    """A fixture less the release that recorded it: two releases' records of
    a scenario are the same iff these are equal."""
    return {k: v for k, v in fx.items() if k != "vllm_version"}


def regenerate(python: str, out: Path, timeout: int = 1800, mode: str = "all") -> tuple[int, str]:
    """Run the generator under ``python`` (a vLLM release's interpreter) into
    ``out`` (``--mode mode``): its exit status and the tail of its error output."""
    import os
    import subprocess

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    res = subprocess.run([python, str(Path(__file__).resolve().parent / "generate_fixtures.py"), "--out", str(out),
                          "--mode", mode],
                         env=env, capture_output=True, text=True, timeout=timeout)
    return res.returncode, res.stderr[-2000:]


def changed_files(version: str, out: Path, subs: tuple[str, ...] = ("", "async"), random: bool = True) -> list[str]:
    """The stored fixtures of ``version`` (in the folders ``subs``) that a
    regeneration into ``out`` did not reproduce byte for byte (with
    ``random``, the random set compared line by line, as its gzip bytes are
    not the point), and the ones it made that are not stored."""
    import gzip

    stored = folder(version)
    changed = []
    for sub in subs:
        made = {p.name for p in (out / sub).glob("*.json")}
        for path in sorted((stored / sub).glob("*.json")):
            again = out / sub / path.name
            if not again.is_file() or again.read_bytes() != path.read_bytes():
                changed.append(f"{sub}/{path.name}".lstrip("/"))
            made.discard(path.name)
        changed += [f"{sub}/{name} (not stored)".lstrip("/") for name in sorted(made)]
    if not random:
        return changed
    old, new = random_path(version), out / RANDOM_NAME
    if not new.is_file() or gzip.decompress(old.read_bytes()) != gzip.decompress(new.read_bytes()):
        changed.append(RANDOM_NAME)
    return changed


MOVED_RECORDS = moved_records(versions())
