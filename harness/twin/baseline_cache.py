"""A disk cache for the pool's baseline calibration (``pool_baselines``).

Why: the calibration is a fixed 4,000-request twin replay read back
through the estimate pipeline, ~25-30 s of one core, and every process
that runs a learned or throughput router paid it again (each sweep worker,
each ``replay``, the test suite's modules). Its result is a handful of
numbers per instance, a pure function of the pool's distinct
configurations, their profiles, the seed and the code that computes them.

So the key hashes exactly those: the configurations and the profiles'
JSON, the seed and calibration constants, and the source of every module
under ``estimators/``, ``harness/twin/``, ``routers/`` and ``traces/`` (a change to the
kernel, the time model or the estimators gives a new key; nothing stale is
ever read). Values are stored as JSON, whose floats round-trip a double
exactly, so a cached run gives the same bytes as a computed one.

Where: ``$LATROUTE_CACHE_DIR``, else ``$XDG_CACHE_HOME/latroute``, else
``~/.cache/latroute``. ``LATROUTE_CACHE_DIR=off`` turns it off. A cache that
cannot be written (read-only home) is skipped silently: it only saves time.
Writes go to a temporary file renamed into place, so a killed process
leaves no half-written entry, and a corrupt entry is recomputed.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("estimators", "harness/twin", "routers", "traces")
_code_digest: str | None = None


def cache_dir() -> Path | None:
    """The cache's directory, or None when turned off."""
    env = os.environ.get("LATROUTE_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "latroute"


def code_digest() -> str:
    """SHA-256 over the source of the modules whose code the cached numbers depend on."""
    global _code_digest
    if _code_digest is None:
        h = hashlib.sha256()
        for d in CODE_DIRS:
            for p in sorted((_ROOT / d).rglob("*.py")):
                h.update(str(p.relative_to(_ROOT)).encode())
                h.update(p.read_bytes())
        _code_digest = h.hexdigest()
    return _code_digest


def key_of(parts: object) -> str:
    """The entry's key: ``parts`` (JSON-able) and the code's digest."""
    blob = json.dumps({"parts": parts, "code": code_digest()}, sort_keys=True, default=repr)
    return hashlib.sha256(blob.encode()).hexdigest()


def cached_json(kind: str, parts: object, compute: Callable[[], object]) -> object:
    """``compute()``'s JSON-able result, read from the cache when an entry
    for (``kind``, ``parts``, the code) is there, else computed and stored."""
    root = cache_dir()
    if root is None:
        return compute()
    path = root / kind / f"{key_of(parts)}.json"
    try:
        return json.loads(path.read_text())["value"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: compute it
    value = compute()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"value": value}, f)
        os.replace(tmp, path)
        tmp = None
    except OSError:
        pass
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return value
