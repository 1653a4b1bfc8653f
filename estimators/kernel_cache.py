"""Numba's on-disk cache of latroute's kernels, kept true to the code.

Why: Numba keys a cached kernel on the source of its own file only
(numba/numba#6018, https://github.com/numba/numba/issues/6018). A kernel
compiled with a function or a constant of another module inside it keeps
that compiled body when the other module changes: the old code runs, or,
when the other module moved, loading the kernel fails with "No module
named ..." on every call. A ``git pull`` or checkout of an editable
install does exactly that. Before the first kernel loads (the packages'
``__init__`` call ``drop_stale_kernels``), this removes the cached
kernels of every module whose own source, or the source of a module it
imports from latroute's packages (followed to the end), changed since
they were cached. What is removed is compiled again on first use: slower
once, never wrong.

Each kernel module's cache directory (where Numba puts it: under
``NUMBA_CACHE_DIR`` when set, else ``__pycache__`` beside the source and
Numba's per-user cache) gets a small file ``<module>.latroute-deps``
holding the hash of the sources the module's kernels were compiled
from; a module whose cached files have no such file is cleared once.
Only the standard library is imported: this runs on every import of the
packages.
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

PACKAGES = ("estimators", "harness", "traces")  # the packages whose modules kernels import
DEPS_SUFFIX = ".latroute-deps"
_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+import\s+(\([^)]*\)|[^\n#]+)|import\s+([\w., ]+))", re.M)
_COMPILED = re.compile(r"^\s*@[\w.]*(?:njit|jit|overload|intrinsic|register_jitable)\b", re.M)  # a kernel's decorator
_DONE: list[bool] = []


def _imports(text: str, modules: dict[str, str], packages: tuple[str, ...]) -> set[str]:
    """The files (``modules``: module name to file) of the package modules ``text`` imports
    (``from a.b import c`` names ``a.b`` and, when it is a module, ``a.b.c``)."""
    found: set[str] = set()
    for m in _IMPORT.finditer(text):
        names = [m.group(1)] if m.group(1) else [n.strip().split(" ")[0] for n in m.group(3).split(",")]
        if m.group(1):
            names += [f"{m.group(1)}.{n.strip().split(' ')[0]}" for n in m.group(2).strip("()").split(",") if n.strip()]
        found.update(modules[n] for n in names if n.split(".")[0] in packages and n in modules)
    return found


def source_closures(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """For every module under ``root``'s packages that compiles kernels (a Numba decorator),
    keyed by its file, the hash of its source and of every package module it imports, followed to
    the end."""
    modules: dict[str, str] = {}  # module name -> its file (a package: its __init__)
    for p in packages:
        for dirpath, _dirs, names in os.walk(root / p):
            rel = os.path.relpath(dirpath, root).replace(os.sep, ".")
            for n in names:
                if n.endswith(".py"):
                    modules[rel if n == "__init__.py" else f"{rel}.{n[:-3]}"] = os.path.join(dirpath, n)
    text: dict[str, str] = {}
    for f in modules.values():
        with open(f, encoding="utf-8", errors="replace") as fh:
            text[f] = fh.read()
    edges: dict[str, set[str]] = {}
    out: dict[str, str] = {}
    for f in sorted(text):
        if not _COMPILED.search(text[f]):
            continue
        seen, todo = {f}, [f]
        while todo:
            g = todo.pop()
            if g not in edges:
                edges[g] = _imports(text[g], modules, packages)
            for d in edges[g] - seen:
                seen.add(d)
                todo.append(d)
        h = hashlib.sha256()
        for g in sorted(seen):
            h.update(f"{os.path.relpath(g, root)}\n".encode())
            h.update(text[g].encode())
        out[f] = h.hexdigest()
    return out


def cache_dirs(py_file: str, cache_root: str | None) -> list[Path]:
    """Where Numba keeps ``py_file``'s cached kernels: ``cache_root`` (``NUMBA_CACHE_DIR``) when
    given, else ``__pycache__`` beside it and the per-user cache (Numba's locators, in
    ``numba/core/caching.py``: the directory's name and the SHA-1 of its absolute path)."""
    parent = os.path.dirname(os.path.abspath(py_file))
    sub = f"{os.path.basename(parent)}_{hashlib.sha1(parent.encode()).hexdigest()}"
    if cache_root:
        return [Path(cache_root) / sub]
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "numba"
    return [Path(parent) / "__pycache__", user / sub]


def drop_stale(root: Path, cache_root: str | None, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
    """Remove the cached kernels of every module whose sources changed since they were cached;
    returns the files removed. Errors of the file system (a read-only tree, a file another process
    removed first) leave the cache as it is: Numba then decides, as it would without this."""
    removed: list[Path] = []
    for f, closure in source_closures(root, packages).items():
        for i, d in enumerate(cache_dirs(f, cache_root)):
            stem = Path(f).stem
            stamp = d / f"{stem}{DEPS_SUFFIX}"
            try:
                if not d.is_dir():
                    if i == 0:  # where Numba will first try to write: stamp what it will compile
                        d.mkdir(parents=True, exist_ok=True)
                        stamp.write_text(closure)
                    continue
                if stamp.is_file() and stamp.read_text() == closure:
                    continue
                for c in d.iterdir():
                    if c.name.startswith(f"{stem}.") and c.suffix in (".nbi", ".nbc"):
                        c.unlink(missing_ok=True)
                        removed.append(c)
                stamp.write_text(closure)
            except OSError:
                continue
    return removed


def drop_stale_kernels() -> None:
    """``drop_stale`` for latroute's own packages, once per process."""
    if _DONE:
        return
    _DONE.append(True)
    drop_stale(Path(os.path.abspath(__file__)).parent.parent, os.environ.get("NUMBA_CACHE_DIR"))
