"""The close step of a recording: join its rotated parts, then remove them.

Kept apart from the writer (``files``) because it is the one place that
deletes a user's files, so it follows a stricter rule than the writer
needs (``record finish`` once dropped rows whose field count differed
from the header, read a device node named like a part as empty, followed a
symlinked part, waited forever on a FIFO, and then deleted the parts):

- every part and every joined file it extends is checked where it enters
  (``traces.files.paths``: no links, FIFOs, devices, sockets or directories;
  UTF-8 or refused with its row), and every line of it is checked too (a
  step line is a JSON object, a request row has its header's field count
  and a numeric ``arrival_s``; parts of one recording share one header).
  Only the last line of a part may be cut (a crash mid-write): it is
  dropped, as before. Anything else is refused (``BadInput``, naming the
  file and row) before anything is written or removed;
- the joined files are written under pid-named temporary names, read back
  and compared with what was meant, renamed into place, read back again,
  and only then are the parts removed.

stdlib only: this runs in vLLM's interpreter at server shutdown too.
"""
from __future__ import annotations

import csv
import glob
import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

from traces.errors import BadInput
from traces.files.paths import decode_text, input_file, read_bytes


def _parts(out_dir: Path, stem: str, ext: str) -> list[str]:
    return sorted(glob.glob(str(out_dir / f"{stem}.[0-9][0-9][0-9][0-9][0-9].{ext}")))


def _text(path: Path, cut_ok: bool) -> str:
    """A part's (or joined file's) text: a regular file, not a link, UTF-8;
    a last line without its newline is dropped where ``cut_ok`` (a part a
    crash cut), refused elsewhere."""
    data = read_bytes(path, "part" if cut_ok else "file", follow_links=False)
    if data and not data.endswith(b"\n"):
        if not cut_ok:
            raise BadInput(path, data.count(b"\n") + 1, "line", "cut (no newline at the end of the file)")
        data = data[: data.rfind(b"\n") + 1]
    return decode_text(data, path)


def _step_lines(path: Path, cut_ok: bool) -> str:
    text = _text(path, cut_ok)
    for row, line in enumerate(text.splitlines(), 1):
        try:
            doc = json.loads(line)
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict) or not {"step", "start_s", "end_s", "items"} <= doc.keys():
            raise BadInput(path, row, "line", "not a step record (a JSON object with step, start_s, end_s, items)")
    return text


def _request_rows(path: Path, cut_ok: bool) -> tuple[list[str] | None, list[list[str]]]:
    """The header and rows of a request part (or of requests.csv)."""
    r = csv.reader(io.StringIO(_text(path, cut_ok), newline=""))
    try:
        header = next(r, None)
        rows = []
        for row in r:
            if len(row) != len(header):
                raise BadInput(path, r.line_num, "fields", f"{len(row)} fields, its header has {len(header)}")
            try:
                float(row[1])
            except ValueError:
                raise BadInput(path, r.line_num, "arrival_s", f"not a number: {row[1][:40]!r}") from None
            rows.append(row)
    except csv.Error as e:
        raise BadInput(path, r.line_num, "line", f"not CSV ({e})") from None
    if header is not None and header[:2] != ["id", "arrival_s"]:
        raise BadInput(path, 1, "header", "not a recorder's requests header (id,arrival_s,...)")
    return header, rows


def _write_verified(path: Path, data: bytes) -> Path:
    """``data`` in a pid-named temporary beside ``path``, read back and
    compared; returns the temporary (renamed by the caller)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would leave the joined file its owner's only
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if _digest(Path(tmp)) != hashlib.sha256(data).digest():
            raise OSError(f"{tmp}: read back differs from what was written")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def _umask() -> int:
    """The process's umask (read by setting it, then set back): the modes ``open`` would give."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _digest(path: Path) -> bytes:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).digest()


def _joined_steps(out_dir: Path, parts: list[str]) -> bytes:
    joined = out_dir / "steps.jsonl"
    texts = [_step_lines(joined, cut_ok=False)] if os.path.lexists(joined) else []
    texts += [_step_lines(Path(p), cut_ok=True) for p in parts]
    return "".join(texts).encode()


def _joined_requests(out_dir: Path, parts: list[str], default_header: list[str]) -> tuple[bytes, int]:
    joined = out_dir / "requests.csv"
    header: list[str] | None = None
    where = None
    rows: list[list[str]] = []
    sources = ([joined] if os.path.lexists(joined) else []) + [Path(p) for p in parts]
    for src in sources:
        h, r = _request_rows(src, cut_ok=src != joined)
        if h is None:
            continue
        if header is None:
            header, where = h, src
        elif h != header:
            raise BadInput(src, 1, "header", f"{len(h)} columns ({','.join(h)[:120]}) where {where.name} has "
                           f"{len(header)}: parts of different recorder versions are not joined (nothing removed)")
        rows.extend(r)
    rows.sort(key=lambda row: float(row[1]))  # stable: hand-over order kept for equal arrivals
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header or default_header)
    w.writerows(rows)
    return buf.getvalue().encode(), len(rows)


def finish_parts(out_dir: str | Path, default_header: list[str]) -> dict:
    """Join the parts of ``out_dir`` into ``steps.jsonl`` and ``requests.csv``
    (requests sorted by arrival), verify, and remove the parts. Idempotent:
    a finished recording has no parts and is left alone. Returns what it
    joined; BadInput (nothing written or removed) for any part it refuses."""
    out_dir = Path(out_dir)
    step_parts, req_parts = _parts(out_dir, "steps", "jsonl"), _parts(out_dir, "requests", "csv")
    done: dict = {"step_parts": len(step_parts), "request_parts": len(req_parts)}
    for p in step_parts + req_parts:
        input_file(p, "part", follow_links=False)  # before opening any: a FIFO would block the open
    plan: list[tuple[Path, bytes]] = []
    if step_parts:
        plan.append((out_dir / "steps.jsonl", _joined_steps(out_dir, step_parts)))
    if req_parts:
        data, n = _joined_requests(out_dir, req_parts, default_header)
        plan.append((out_dir / "requests.csv", data))
        done["requests"] = n
    tmps: list[Path] = []
    try:
        for path, data in plan:
            tmps.append(_write_verified(path, data))
        for (path, _data), tmp in zip(plan, tmps):
            os.replace(tmp, path)
    except BaseException:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise
    for path, data in plan:  # the joined recording, read back, before any part goes
        if _digest(path) != hashlib.sha256(data).digest():
            raise OSError(f"{path}: the joined file reads back differently; the parts are kept")
    for p in step_parts + req_parts:
        os.unlink(p)
    return done
