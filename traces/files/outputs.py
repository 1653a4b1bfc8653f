"""Where latroute writes its outputs, and what it may replace.

Every output is built beside its final place and renamed into it only when
complete, so a crash or a refused input never leaves a half-written result
behind (sweeps are the one resumable output: ``harness/sweep/store.py``).

What latroute may replace is what it wrote (the checks are
``traces.files.output_checks``): every output directory carries
a marker file (``.latroute``, holding its kind) and every JSON file output
(profiles, baselines) a marker key (``"latroute_output": KIND``). ``--force``
replaces only a path that carries the marker and refuses everything else
(devices, pipes, sockets, symbolic links, user files and directories, ``.``
and its ancestors, the command's own inputs) in one line, before any work.

Two writers to one output are kept apart by a lock file beside it
(``.NAME.lock``, ``flock``ed and holding the writer's pid) held from the
check to the rename. Temporary names carry the writer's pid
(``.NAME.tmp-PID-xxxx``), so the next writer to NAME can tell a killed
run's debris (pid dead: removed, and said so on stderr) from a live run's.
A replaced output is swapped out atomically (``renameat2(RENAME_EXCHANGE)``)
and removed under a temporary name, so no ``.NAME.old`` is ever left.
Everything created honours the umask (``mkdtemp``/``mkstemp`` alone would
give 0700/0600).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from traces.errors import BadInput

if TYPE_CHECKING:
    import pandas as pd

# the checks, also importable from here (where callers have always found them)
from traces.files.output_checks import JSON_MARKER, MARKER, _kind_of, _refuse, check_out, write_manifest
from traces.files.output_checks import dir_kind as dir_kind
from traces.files.output_checks import dir_marked as dir_marked
from traces.files.output_checks import file_marked as file_marked
from traces.files.output_checks import stranger as stranger

# ---------------------------------------------------------------- permissions

def current_umask() -> int:
    """The process umask, read without changing it where Linux allows
    (changing it, even briefly, races with other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def honour_umask(path: Path, directory: bool) -> None:
    """Give a ``mkdtemp``/``mkstemp`` result the mode a plain mkdir/open would have."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


# ---------------------------------------------------------------- lock and debris

class OutputLock:
    """An exclusive lock on writing ``out``: ``.NAME.lock`` beside it,
    ``flock``ed (released by the kernel if the writer dies) and holding the
    writer's pid for the refusal message. Never waits: a second writer is
    refused at once."""

    def __init__(self, out: Path, option: str = "--out"):
        self.out = Path(out)
        self.path = self.out.with_name(f".{self.out.name}.lock")
        self.fd: int | None = None
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666 & ~current_umask())
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise _refuse(self.out, f"another latroute run is writing {self.out} (pid {holder})", option) from None
            try:  # the file may have been unlinked by its previous holder after we opened it
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)  # while still holding it: a waiter re-checks the inode
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temp_prefix(name: str) -> str:
    """The prefix of every temporary name for output ``name``: it carries the pid."""
    return f".{name}.tmp-{os.getpid()}-"


def clean_debris(out: Path) -> list[str]:
    """Remove what killed writers of ``out`` left beside it (temporary names
    whose pid is no longer alive; live writers' are left alone) and say so
    on stderr in one line. Returns the names removed."""
    out = Path(out)
    return _clean(out.parent, re.compile(rf"^\.{re.escape(out.name)}\.(?:tmp|old)-(\d+)(?:-|$)"), f"beside {out}")


def clean_debris_in(directory: Path) -> list[str]:
    """``clean_debris`` for every name in ``directory`` (a sweep's cells)."""
    return _clean(Path(directory), re.compile(r"^\..+\.tmp-(\d+)-"), f"in {directory}")


def _clean(parent: Path, pattern: re.Pattern, where: str) -> list[str]:
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        m = pattern.match(entry.name)
        if not m or _pid_alive(int(m.group(1))):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:
            continue
    if removed:
        print(f"note: removed {len(removed)} leftover(s) of killed latroute runs {where}: "
              + ", ".join(sorted(removed)), file=sys.stderr)
    return removed


# ---------------------------------------------------------------- replacing

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _remove(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        Path(path).unlink(missing_ok=True)


def replace_with(tmp: Path, out: Path) -> None:
    """Move finished ``tmp`` onto ``out``; an existing ``out`` is swapped
    out atomically and removed under ``tmp``'s name (which carries this pid,
    so a kill at that moment leaves debris the next run removes)."""
    if not os.path.lexists(out):
        os.rename(tmp, out)
        return
    if _exchange(tmp, out):
        _remove(tmp)
        return
    aside = Path(f"{tmp}-old")
    os.rename(out, aside)
    os.rename(tmp, out)
    _remove(aside)


# ---------------------------------------------------------------- writers

class StagedDir:
    """An output directory built beside its final place and renamed into it
    only when complete (``with StagedDir(out) as tmp: ...``). On any
    exception the staging directory is removed and ``out`` is untouched; an
    existing ``out`` is replaced only with ``force`` and only if latroute
    wrote it (``check_out``). The output lock is held from here to the
    rename, and killed runs' debris beside ``out`` is cleared first."""

    def __init__(self, out: str | Path, force: bool = False, kind: str = "output", inputs: Iterable[Any] = (),
                 option: str = "--out"):
        self.force, self.kind, self.option = force, kind, option
        self.inputs = list(inputs)
        self.out = check_out(out, force, kind="dir", inputs=self.inputs, option=option)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.lock = _lock_for(self, self.out, option)
        try:
            check_out(self.out, force, kind="dir", inputs=self.inputs, option=option, held=True)  # again, now ours
            clean_debris(self.out)
            self.tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(self.out.name), dir=self.out.parent))
            honour_umask(self.tmp, directory=True)
            (self.tmp / MARKER).write_text(f"{kind}\n")
        except BaseException:  # Ctrl-C / SIGTERM here too: no staging directory left behind
            if getattr(self, "tmp", None) is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
            self.lock.release()
            raise

    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
            return
        self.commit()

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.lock.release()

    def commit(self) -> None:
        try:
            write_manifest(self.tmp, self.kind)  # what --force may later remove: these names, nothing else
            check_out(self.out, self.force, kind="dir", option=self.option, held=True)
            replace_with(self.tmp, self.out)
        except BaseException:
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        finally:
            self.lock.release()

    def abandoned(self) -> bool:
        """Whether a caller removed the staging directory without ``abort``
        (its lock is then stale in this process)."""
        tmp = getattr(self, "tmp", None)
        return self.lock.fd is not None and tmp is not None and not os.path.isdir(tmp)


_HOLDERS: dict[str, StagedDir] = {}  # lock path -> the StagedDir of this process holding it


def _lock_for(staged: StagedDir, out: Path, option: str) -> OutputLock:
    """The output lock for ``staged``; a lock this process still holds for
    a staging directory its caller removed without ``abort`` (an exception
    path that only deleted the directory) is released first."""
    key = os.path.abspath(out.with_name(f".{out.name}.lock"))
    try:
        lock = OutputLock(out, option)
    except BadInput:
        holder = _HOLDERS.get(key)
        if holder is None or not holder.abandoned():
            raise
        holder.lock.release()
        lock = OutputLock(out, option)
    _HOLDERS[key] = staged
    return lock


def _check_writable_file(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    special = _kind_of(st.st_mode)
    if special is not None or stat.S_ISDIR(st.st_mode):
        raise _refuse(path, f"is {special or 'a directory'}: latroute never writes into or replaces it", "output")


def atomic_write_text(path: Path, text: str) -> None:
    """Write a small text file atomically (temp file in the same directory,
    carrying this pid, then rename), with the umask's mode. Never writes
    through a device, pipe, socket or link and never replaces a directory."""
    path = Path(path)
    _check_writable_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        honour_umask(Path(tmp), directory=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_output_json(path: str | Path, doc: dict, kind: str, force: bool = True, option: str = "--out") -> None:
    """A JSON file output (profile, baseline): carries ``JSON_MARKER`` so a
    later ``--force`` knows latroute wrote it, replaces only such a file
    (``check_out``), under the output lock, strict JSON."""
    from traces.files.jsonio import dump_json

    path = Path(path)
    check_out(path, force, kind="file", option=option)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = OutputLock(path, option)
    try:
        check_out(path, force, kind="file", option=option, held=True)
        clean_debris(path)
        atomic_write_text(path, dump_json({JSON_MARKER: kind, **doc}, indent=2) + "\n")
    finally:
        lock.release()


def write_json(path: Path, doc: Any) -> None:
    """Strict JSON (NaN written as null; Infinity is a bug: ValueError)."""
    from traces.files.jsonio import dump_json

    atomic_write_text(Path(path), dump_json(doc, indent=2, default=str) + "\n")


def write_parquet(path: Path, df: pd.DataFrame) -> None:
    """A results table (not a trace table): plain Parquet, no pandas metadata."""
    table = pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)
    pq.write_table(table, path, compression="zstd")
