"""Strict JSON in and out.

Python's ``json`` reads and writes ``NaN`` and ``Infinity``, which no other
JSON reader accepts and which let a NaN metric slip through a regression
gate as "ok". latroute reads and writes JSON only through these two
functions: NaN, ±Infinity, numbers that overflow a float, integers of more
digits than Python parses, and nesting deeper than ``MAX_DEPTH`` are refused
with the file and line; on output NaN becomes ``null`` and Infinity is an
error (a bug, not data).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from traces.errors import BadInput

MAX_DEPTH = 64
MAX_BYTES = 256 << 20  # larger JSON is not something latroute writes or reads


class _Refused(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise _Refused(f"{text} does not fit a float")
    return v


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # more digits than sys.get_int_max_str_digits()
        raise _Refused(f"an integer of {len(text)} digits is not a number latroute reads") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object naming a key twice is ambiguous (Python keeps the last; others the first)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _Refused(f"key {k[:60]!r} appears twice in one object")
        out[k] = v
    return out


def _depth(doc: Any) -> int:
    depth, level = 0, [doc]
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            return depth
        nxt: list[Any] = []
        for v in level:
            if isinstance(v, dict):
                nxt.extend(v.values())
            elif isinstance(v, list):
                nxt.extend(v)
        level = nxt
    return depth - 1


def parse_json(text: str, file: str | Path, what: str) -> Any:
    """Parse ``text`` strictly; BadInput(file, line, what, reason) otherwise."""
    if len(text) > MAX_BYTES:
        raise BadInput(file, None, what, f"larger than {MAX_BYTES >> 20} MB")
    try:
        doc = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_int,
                         object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise BadInput(file, e.lineno, what, f"not valid JSON ({e.msg})") from None
    except _Refused as e:
        raise BadInput(file, None, what, f"not strict JSON: {e}") from None
    except RecursionError:
        raise BadInput(file, None, what, f"nested deeper than {MAX_DEPTH} levels") from None
    if _depth(doc) > MAX_DEPTH:
        raise BadInput(file, None, what, f"nested deeper than {MAX_DEPTH} levels")
    return doc


def read_json(path: str | Path, what: str) -> Any:
    """Read and parse a JSON file strictly (UTF-8, a byte-order mark
    stripped; through traces.files.paths, so a FIFO or device is refused rather
    than waited on, and a file above MAX_BYTES is refused unread)."""
    from traces.files.paths import read_text

    path = Path(path)
    text = read_text(path, what, max_bytes=MAX_BYTES, line_max=0)  # JSON may be one long line
    return parse_json(text, path, what)


def _nan_to_null(v: Any) -> Any:
    if isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, dict):
        return {k: _nan_to_null(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_nan_to_null(x) for x in v]
    return v


def dump_json(doc: Any, **kwargs: Any) -> str:
    """Strict JSON text: NaN written as null, Infinity refused (ValueError)."""
    return json.dumps(_nan_to_null(doc), allow_nan=False, **kwargs)
