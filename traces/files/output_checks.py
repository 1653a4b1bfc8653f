"""What latroute may replace (``check_out``): an output path is checked, before
any work, against the markers latroute writes (``.latroute`` in every output
directory, ``"latroute_output"`` in every JSON file output), the command's
own inputs, ``.`` and its ancestors, kernel file systems, special files and
a live writer's lock. The writing itself is ``traces.files.outputs``.

The marker covers what latroute wrote, not what was put beside it since
(``--force`` onto a marked directory once deleted a user's file, a FIFO
and a device node added to it). A directory built whole and renamed into
place (``StagedDir``) records in its marker every name it holds (``f`` file,
``d`` directory, one JSON-quoted relative path a line: ``write_manifest``);
``--force`` replaces it only if nothing else is there now, and names the
first stranger. A marker without that list (outputs written in place, as
sweeps are, or before the list existed) still never covers a link or a
special file inside it: those are refused too.
"""
from __future__ import annotations

import fcntl
import json
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traces.errors import BadInput

if TYPE_CHECKING:
    pass

MARKER = ".latroute"  # in every output directory latroute writes; holds the kind
LEGACY_MARKERS = (".latroute-sweep",)  # sweeps written before the general marker
JSON_MARKER = "latroute_output"  # key of every JSON file output; value: the kind
FORBIDDEN_ROOTS = ("/proc", "/sys", "/dev")  # kernel and device file systems: never outputs
NAME_MAX = 255  # bytes per path component (Linux, every common file system)
PATH_MAX = 4095  # bytes per path
_MARKED_JSON_MAX_BYTES = 64 << 20  # a larger "profile" is not one latroute wrote
_MANIFEST_MAX_BYTES = 64 << 20  # a larger marker is not one latroute wrote
MANIFEST_MAX_ENTRIES = 1_000_000  # a marked directory holding more is not replaced (the walk is bounded)


# ---------------------------------------------------------------- checking

def _refuse(out: str | Path, reason: str, option: str) -> BadInput:
    return BadInput(out, None, option, reason)


def _kind_of(mode: int) -> str | None:
    """The name of a special file's kind (None for files and directories)."""
    for test, name in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return None


def dir_marked(path: Path) -> bool:
    """Whether ``path`` is a directory latroute wrote (its marker file, not a link, is there)."""
    for name in (MARKER, *LEGACY_MARKERS):
        try:
            if stat.S_ISREG(os.lstat(Path(path) / name).st_mode):
                return True
        except OSError:
            continue
    return False


def _marker_lines(path: Path) -> list[str] | None:
    """The lines of ``path``'s marker (a regular file, not followed), None if unreadable."""
    try:
        fd = os.open(Path(path) / MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            data = f.read(_MANIFEST_MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > _MANIFEST_MAX_BYTES:
        return None
    return data.decode("utf-8", "replace").splitlines()


def dir_kind(path: Path) -> str | None:
    """The kind a marked directory records (``sweep``, ``trace``, ...), None if unmarked."""
    lines = _marker_lines(path)
    if lines is None:
        return "sweep" if dir_marked(path) else None
    return (lines[0].strip() if lines else "") or "output"


def _entries(root: Path) -> list[tuple[str, str]]:
    """(type, relative path) of everything under ``root``, links not followed:
    type ``d``, ``f`` or a special kind's name (``a symbolic link``, ...).
    Stops after MANIFEST_MAX_ENTRIES (the caller refuses that)."""
    out: list[tuple[str, str]] = []
    todo = [""]
    while todo and len(out) <= MANIFEST_MAX_ENTRIES:
        rel = todo.pop()
        try:
            entries = sorted(os.scandir(os.path.join(root, rel) if rel else root), key=lambda e: e.name)
        except OSError:
            out.append(("an unreadable directory", rel))
            continue
        for e in entries:
            name = f"{rel}/{e.name}" if rel else e.name
            try:
                mode = e.stat(follow_symlinks=False).st_mode
            except OSError:
                out.append(("an unreadable entry", name))
                continue
            if stat.S_ISDIR(mode):
                out.append(("d", name))
                todo.append(name)
            elif stat.S_ISREG(mode):
                out.append(("f", name))
            else:
                out.append((_kind_of(mode) or "a special file", name))
    return sorted(out, key=lambda t: t[1])


def write_manifest(directory: Path, kind: str) -> None:
    """The marker of a finished directory: its kind, then every name in it."""
    lines = [f"{t} {json.dumps(rel)}" for t, rel in _entries(Path(directory)) if rel != MARKER]
    (Path(directory) / MARKER).write_text(f"{kind}\n" + "".join(f"{ln}\n" for ln in lines))


DAMAGED = frozenset()  # a manifest whose lines do not parse: it covers nothing, and is itself what to name


def _manifest(lines: list[str]) -> set[tuple[str, str]] | frozenset | None:
    if len(lines) < 2:
        return None  # kind only: written in place, or before manifests
    listed = set()
    for ln in lines[1:]:
        t, _, rel = ln.partition(" ")
        try:
            name = json.loads(rel)
        except ValueError:
            return DAMAGED
        if t in ("d", "f") and isinstance(name, str):
            listed.add((t, name))
    return listed


def stranger(out: Path) -> str | None:
    """What in marked directory ``out`` latroute did not write (the first
    such entry, described), or None: with a manifest, anything it does not
    list; without one, any link or special file."""
    lines = _marker_lines(out) or []
    listed = _manifest(lines)
    entries = _entries(out)
    if len(entries) > MANIFEST_MAX_ENTRIES:
        return f"more than {MANIFEST_MAX_ENTRIES:,} entries"
    if listed is DAMAGED:
        return f"{out / MARKER} (its list of what latroute wrote there is damaged)"
    for t, rel in entries:
        if rel == MARKER or (rel in LEGACY_MARKERS and t == "f"):
            continue
        if t not in ("d", "f"):
            return f"{out / rel} ({t})"
        if listed is not None and (t, rel) not in listed:
            return f"{out / rel} ({'a directory' if t == 'd' else 'a file'} latroute did not write there)"
    return None


def file_marked(path: Path) -> bool:
    """Whether a regular file is a JSON document carrying latroute's marker key."""
    try:
        if os.lstat(path).st_size > _MARKED_JSON_MAX_BYTES:
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and isinstance(doc.get(JSON_MARKER), str)


def _path_text_ok(out: str | Path, option: str) -> None:
    raw = os.fsencode(out)
    if not raw:
        raise _refuse(out, "is empty", option)
    if b"\0" in raw:
        raise _refuse(out, "contains a NUL byte", option)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:  # pyarrow and DuckDB take paths as UTF-8 text: the write would fail after the work
        raise _refuse(out, "is not valid UTF-8 (outputs need a UTF-8 path)", option) from None
    if len(raw) > PATH_MAX:
        raise _refuse(out, f"is longer than {PATH_MAX} bytes (file name too long)", option)
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            raise _refuse(out, f"has a component longer than {NAME_MAX} bytes (file name too long)", option)


def _inside(a: Path, b: Path) -> bool:
    """Whether ``a`` is ``b`` or lies under it (both resolved)."""
    return a == b or b in a.parents


def _check_parent(out: str | Path, parent: Path, option: str) -> None:
    anc = parent
    while not os.path.lexists(anc):
        anc = anc.parent
    if not os.path.isdir(anc):
        raise _refuse(out, f"{anc} is not a directory", option)
    if not os.access(anc, os.W_OK | os.X_OK):
        raise _refuse(out, f"cannot write in {anc} (permission denied)", option)
    try:
        if os.statvfs(anc).f_flag & os.ST_RDONLY:
            raise _refuse(out, f"{anc} is on a read-only file system", option)
    except OSError:
        pass


def _check_not_locked(out: Path, option: str) -> None:
    """Refuse at once, not after the work, an output another run is writing."""
    path = out.with_name(f".{out.name}.lock")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        raise _refuse(out, f"another latroute run is writing {out} (pid {holder})", option) from None
    finally:
        os.close(fd)


def check_out(out: str | Path, force: bool = False, *, kind: str = "dir", inputs: Iterable[Any] = (),
              option: str = "--out", owner: str = "latroute", held: bool = False) -> Path:
    """Refuse (BadInput) an output path latroute must not write or replace,
    before any work starts; returns it as a Path.

    ``kind`` is ``dir`` (a result or trace directory) or ``file`` (a JSON
    file such as a profile or baseline). ``inputs`` are the command's input
    paths: the output may be none of them, contain none, lie inside none.
    An empty plain directory may be written into without ``force``;
    ``owner`` names the writer in the refusal of a foreign directory;
    ``held``: the caller holds the output's lock (no probe of it).
    """
    _path_text_ok(out, option)
    out = Path(out)
    absolute = Path(os.path.abspath(out))
    real = Path(os.path.realpath(absolute.parent)) / absolute.name if absolute.name else absolute
    for root in FORBIDDEN_ROOTS:
        if _inside(real, Path(root)) or _inside(absolute, Path(root)):
            raise _refuse(out, f"is under {root}: not a place for latroute's outputs", option)
    cwd = Path(os.path.realpath(os.getcwd()))
    if _inside(cwd, real):
        raise _refuse(out, "is the working directory or one of its parents: latroute never replaces it", option)
    for inp in inputs:
        if inp is None:
            continue
        rin = Path(os.path.realpath(os.path.abspath(inp)))
        if _inside(real, rin) or _inside(rin, real):
            what = "is" if real == rin else ("lies inside" if _inside(real, rin) else "contains")
            raise _refuse(out, f"{what} the input {inp}: an output never replaces what the command reads", option)
    _check_parent(out, absolute.parent, option)
    if not held:
        _check_not_locked(out, option)
    try:
        st = os.lstat(out)
    except FileNotFoundError:
        return out
    except OSError as e:
        raise _refuse(out, f"cannot be examined ({e.strerror})", option) from None
    special = _kind_of(st.st_mode)
    if special is not None:
        raise _refuse(out, f"is {special}: latroute never writes into or replaces it", option)
    if stat.S_ISDIR(st.st_mode):
        if kind == "file":
            raise _refuse(out, "is a directory (a file is written here)", option)
        try:
            empty = not any(os.scandir(out))
        except OSError as e:
            raise _refuse(out, f"cannot be read ({e.strerror})", option) from None
        if empty:
            return out
        _replaceable(out, force, lambda: dir_marked(out), f"{owner} (no {MARKER} marker)", option)
        other = stranger(out)
        if other is not None:
            raise _refuse(out, f"holds {other}: --force replaces only what latroute wrote (move it out first)",
                          option)
        return out
    if kind == "dir":
        raise _refuse(out, "is a file, not a directory latroute wrote" + ("" if force else " (nothing replaced)"),
                      option)
    return _replaceable(out, force, lambda: file_marked(out), f'latroute (no "{JSON_MARKER}" key)', option)


def _replaceable(out: Path, force: bool, marked: Callable[[], bool], writer: str, option: str) -> Path:
    """An existing output may be replaced only with ``force``, and only if
    latroute wrote it (``marked``)."""
    if not force:
        raise _refuse(out, "already exists (pass --force to replace it)", option)
    if not marked():
        raise _refuse(out, f"exists and was not written by {writer}: --force replaces only latroute's own outputs",
                      option)
    return out
