"""Where every input path enters: what a command may open and read.

A FIFO named like a part waits forever, a device node reads as empty or
endless, a socket cannot be opened: a command that opens such a path either
hangs or reads nonsense, so every read of a user's path goes through here
first and is refused in the one error line (file, exit 2) before any work.
Text inputs are decoded here too, so the encoding rule (UTF-8, a leading
UTF-8 byte-order mark stripped, anything else refused with its row) and the
line-length limit are stated once.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from traces.errors import BadInput

LINE_MAX_BYTES = 1 << 20  # a text line longer than 1 MB is not a trace row: refused with its row
UTF8_BOM = b"\xef\xbb\xbf"

_SPECIAL = ((stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a character device"),
            (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def special_kind(mode: int) -> str | None:
    """The name of a special file's kind (None for files, directories and links)."""
    for test, name in _SPECIAL:
        if test(mode):
            return name
    return None


def input_file(path: str | Path, column: str = "file", follow_links: bool = True) -> Path:
    """``path`` as a regular file latroute may read, or BadInput naming it.

    Symbolic links to regular files are followed unless ``follow_links`` is
    False (where latroute will later remove what it read, a link is refused:
    the data it points at is not the recording's)."""
    p = Path(path)
    try:
        st = os.stat(p) if follow_links else os.lstat(p)
    except FileNotFoundError:
        raise BadInput(p, None, column, "no such file") from None
    except OSError as e:
        raise BadInput(p, None, column, f"cannot be read ({e.strerror or e})") from None
    if not follow_links and stat.S_ISLNK(st.st_mode):
        raise BadInput(p, None, column, "is a symbolic link (refused: latroute reads only the file itself here)")
    kind = special_kind(st.st_mode)
    if kind:
        raise BadInput(p, None, column, f"is {kind}, not a regular file")
    if stat.S_ISDIR(st.st_mode):
        raise BadInput(p, None, column, "is a directory, not a file")
    if not os.access(p, os.R_OK):
        raise BadInput(p, None, column, "cannot be read (permission denied)")
    return p


def input_dir(path: str | Path, column: str = "directory") -> Path:
    """``path`` as a directory latroute may list, or BadInput naming it."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise BadInput(p, None, column, "no such directory") from None
    except OSError as e:
        raise BadInput(p, None, column, f"cannot be read ({e.strerror or e})") from None
    if not stat.S_ISDIR(st.st_mode):
        kind = special_kind(st.st_mode) or "a file"
        raise BadInput(p, None, column, f"is {kind}, not a directory")
    if not os.access(p, os.R_OK | os.X_OK):
        raise BadInput(p, None, column, "cannot be listed (permission denied)")
    return p


def read_bytes(path: str | Path, column: str = "file", max_bytes: int | None = None,
               follow_links: bool = True) -> bytes:
    """The bytes of a regular file, refused (not truncated) above ``max_bytes``."""
    p = input_file(path, column, follow_links)
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(p, flags)
    except OSError as e:
        raise BadInput(p, None, column, f"cannot be read ({e.strerror or e})") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced between the check and the open
            raise BadInput(p, None, column, "is not a regular file")
        data = f.read() if max_bytes is None else f.read(max_bytes + 1)
    if max_bytes is not None and len(data) > max_bytes:
        raise BadInput(p, None, column, f"larger than {max_bytes} bytes (not a file latroute wrote or reads)")
    return data


def decode_text(data: bytes, path: str | Path, column: str = "encoding",
                line_max: int = LINE_MAX_BYTES) -> str:
    """UTF-8 text with a leading byte-order mark stripped; another encoding,
    or a line over ``line_max`` bytes, is refused with its 1-based row."""
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM):]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        row = data.count(b"\n", 0, e.start) + 1
        raise BadInput(path, row, column, f"not UTF-8 (byte 0x{data[e.start]:02x}); save the file as UTF-8") from None
    if line_max and len(data) > line_max:
        start = 0
        row = 1
        while start < len(data):
            end = data.find(b"\n", start)
            end = len(data) if end < 0 else end
            if end - start > line_max:
                raise BadInput(path, row, "line", f"longer than {line_max} bytes (limit per line)")
            start, row = end + 1, row + 1
    return text


def read_text(path: str | Path, column: str = "file", max_bytes: int | None = None,
              follow_links: bool = True, line_max: int = LINE_MAX_BYTES) -> str:
    """A user's text file, checked as ``read_bytes`` and ``decode_text`` do."""
    p = Path(path)
    return decode_text(read_bytes(p, column, max_bytes, follow_links), p, line_max=line_max)
