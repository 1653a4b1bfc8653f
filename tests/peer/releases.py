"""The peer fixtures per vLLM release: where each release's records are
stored, which interpreter regenerates them, and which (release, scenario)
pairs are known to differ from the kernel.

Why per release: latroute's kernel follows one vLLM release's scheduler
(``KERNEL_VERSION``), but users run what they deployed, and the scheduler's
rules moved between releases. Each release's fixtures are recorded by
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

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# the release whose scheduler the kernel follows (traces.vllm_releases.versions checks it is a checked one)
KERNEL_VERSION = "0.32.0"

# (release, mode, scenario) -> what in that release makes its record differ from the kernel's.
# mode is "sync", "async" or "random"; each entry is work left for the engine (a version variant),
# and the test that reads this table is strict: an entry that starts agreeing fails it.
EXPECTED_TO_DIFFER: dict[tuple[str, str, str], str] = {}


def python_variable(version: str) -> str:
    """The environment variable naming release ``version``'s interpreter."""
    return "LATROUTE_VLLM_PYTHON_" + version.replace(".", "_")


def folder(version: str) -> Path:
    return FIXTURES / version


def versions() -> list[str]:
    """Every release with stored fixtures, oldest first."""
    found = [p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name[:1].isdigit()]
    return sorted(found, key=lambda v: tuple(int(x) for x in v.split(".")))


def sync_paths(version: str) -> list[Path]:
    return sorted(folder(version).glob("*.json"))


def async_paths(version: str) -> list[Path]:
    return sorted((folder(version) / "async").glob("*.json"))


RANDOM_NAME = "async_random.jsonl.gz"  # the random async set, one file per release (random_fixtures)


def random_path(version: str) -> Path:
    return folder(version) / RANDOM_NAME


def without_version(fx: dict) -> dict:
    """A fixture less the release that recorded it: two releases' records of
    a scenario are the same iff these are equal."""
    return {k: v for k, v in fx.items() if k != "vllm_version"}


def regenerate(python: str, out: Path, timeout: int = 1800) -> tuple[int, str]:
    """Run the generator under ``python`` (a vLLM release's interpreter) into
    ``out``: its exit status and the tail of its error output."""
    import os
    import subprocess

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    res = subprocess.run([python, str(Path(__file__).resolve().parent / "generate_fixtures.py"), "--out", str(out)],
                         env=env, capture_output=True, text=True, timeout=timeout)
    return res.returncode, res.stderr[-2000:]


def changed_files(version: str, out: Path) -> list[str]:
    """The stored fixtures of ``version`` that a regeneration into ``out``
    did not reproduce byte for byte (the random set compared line by line,
    as its gzip bytes are not the point), and the ones it made that are not
    stored."""
    import gzip

    stored = folder(version)
    changed = []
    for sub in ("", "async"):
        made = {p.name for p in (out / sub).glob("*.json")}
        for path in sorted((stored / sub).glob("*.json")):
            again = out / sub / path.name
            if not again.is_file() or again.read_bytes() != path.read_bytes():
                changed.append(f"{sub}/{path.name}".lstrip("/"))
            made.discard(path.name)
        changed += [f"{sub}/{name} (not stored)".lstrip("/") for name in sorted(made)]
    old, new = random_path(version), out / RANDOM_NAME
    if not new.is_file() or gzip.decompress(old.read_bytes()) != gzip.decompress(new.read_bytes()):
        changed.append(RANDOM_NAME)
    return changed
