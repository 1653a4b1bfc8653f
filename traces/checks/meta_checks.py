"""The keys of a trace's meta.json that commands read, checked for type
when the trace is opened (``traces.store.Trace``): a ``source`` given as a
string, ``tables`` as a list or ``hash_block_tokens`` as text would
otherwise fail deep inside a command as an internal error, or be read as
something else. Unknown keys are kept as they are (later versions add keys).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from traces.datamodel.limits import MAX_ENGINE, MAX_ID, MAX_TIME_S, shown
from traces.errors import BadInput

SOURCE_TEXT_KEYS = ("kind", "file", "dir", "vllm_version", "platform")
SOURCE_OBJECT_KEYS = ("engine_kwargs", "hardware")  # vllm-reqstats: what the run saved (read by the weight floor)
ENGINE_MARKS = ("given", "inferred", "defaulted")  # traces.importers.engine_settings
COMPLETENESS = ("complete", "incomplete", "unknown")  # traces.importers.completeness


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    return {dict: "object", list: "list", str: "string"}.get(type(v), "number")


def _whole(v: Any, low: int, high: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high


def check_meta(meta: dict, path: Path) -> None:
    """Refuse a meta.json key of the wrong type or range (BadInput naming the key)."""
    src = meta.get("source")
    if src is not None:
        if not isinstance(src, dict):
            raise BadInput(path, None, "source", f"must be a JSON object, got a {_kind(src)}: {shown(src)}")
        for key in SOURCE_TEXT_KEYS:
            v = src.get(key)
            if v is not None and not isinstance(v, str):
                raise BadInput(path, None, f"source.{key}", f"must be a string, got a {_kind(v)}: {shown(v)}")
        for key in SOURCE_OBJECT_KEYS:
            v = src.get(key)
            if v is not None and not isinstance(v, dict):
                raise BadInput(path, None, f"source.{key}", f"must be a JSON object, got a {_kind(v)}: {shown(v)}")
    for key in ("arrivals", "created", "wall_clock_start"):
        v = meta.get(key)
        if v is not None and not isinstance(v, str):
            raise BadInput(path, None, key, f"must be a string, got a {_kind(v)}: {shown(v)}")
    tables = meta.get("tables")
    if tables is not None:
        if not isinstance(tables, dict):
            raise BadInput(path, None, "tables", f"must be a JSON object, got a {_kind(tables)}: {shown(tables)}")
        for name, n in tables.items():
            if not _whole(n, 0, MAX_ID):
                raise BadInput(path, None, f"tables.{name}", f"must be a row count, got {shown(n)}")
    hbt = meta.get("hash_block_tokens")
    if hbt is not None and not _whole(hbt, 1, MAX_ENGINE):
        raise BadInput(path, None, "hash_block_tokens", f"must be a whole number in [1, {MAX_ENGINE}], got {shown(hbt)}")
    fo = meta.get("frontend_overhead_s")
    if fo is not None and (isinstance(fo, bool) or not isinstance(fo, (int, float)) or not math.isfinite(fo)
                           or not 0 <= fo <= MAX_TIME_S):
        raise BadInput(path, None, "frontend_overhead_s", f"must be a number of seconds >= 0, got {shown(fo)}")
    warm = meta.get("warm_prefix")
    if warm is not None:
        if not isinstance(warm, dict):
            raise BadInput(path, None, "warm_prefix", f"must be a JSON object, got a {_kind(warm)}: {shown(warm)}")
        n = warm.get("warmup_requests")
        if n is not None and not _whole(n, 0, MAX_ID):
            raise BadInput(path, None, "warm_prefix.warmup_requests", f"must be a whole number >= 0, got {shown(n)}")
    _check_engine(meta.get("engine"), path)
    _check_completeness(meta.get("completeness"), path)


def _check_engine(engine: Any, path: Path) -> None:
    """``engine`` of a request-level import: settings with a mark each, and the unmodelled ones accepted."""
    if engine is None:
        return
    if not isinstance(engine, dict):
        raise BadInput(path, None, "engine", f"must be a JSON object, got a {_kind(engine)}: {shown(engine)}")
    for key in ("settings", "marks", "sources"):
        v = engine.get(key)
        if v is not None and not isinstance(v, dict):
            raise BadInput(path, None, f"engine.{key}", f"must be a JSON object, got a {_kind(v)}: {shown(v)}")
    for k, mark in (engine.get("marks") or {}).items():
        if mark not in ENGINE_MARKS:
            raise BadInput(path, None, f"engine.marks.{k}", f"must be one of {', '.join(ENGINE_MARKS)}, got {shown(mark)}")
    for key in ("not_modelled", "accepted_unmodelled"):
        v = engine.get(key)
        if v is not None and (not isinstance(v, list) or not all(isinstance(x, str) for x in v)):
            raise BadInput(path, None, f"engine.{key}", f"must be a list of strings, got {shown(v)}")


def _check_completeness(done: Any, path: Path) -> None:
    """``completeness``: whether the run logged every request it sent."""
    if done is None:
        return
    if not isinstance(done, dict):
        raise BadInput(path, None, "completeness", f"must be a JSON object, got a {_kind(done)}: {shown(done)}")
    if done.get("status") not in COMPLETENESS:
        raise BadInput(path, None, "completeness.status",
                       f"must be one of {', '.join(COMPLETENESS)}, got {shown(done.get('status'))}")
    for key in ("logged", "sent", "missing"):
        v = done.get(key)
        if v is not None and not _whole(v, 0, MAX_ID):
            raise BadInput(path, None, f"completeness.{key}", f"must be a whole number >= 0 or null, got {shown(v)}")
