"""Result directories written by ``estimate``, ``validate``, ``replay`` and
``sweep``: the header every ``metrics.json`` carries, and reading them back.

Every metrics.json starts with ``kind`` (estimate | validate | replay |
sweep), ``schema_version``, ``latroute_version`` and ``command`` (the
command line that wrote it), so a reader never guesses what it holds.
Results written before the header existed are recognised by what they
contain (``schema_version`` 0).
"""
from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from traces.errors import BadInput
from traces.files.jsonio import read_json
from traces.files.paths import input_dir, input_file

RESULT_KINDS = ("estimate", "validate", "replay", "sweep")
RESULT_SCHEMA_VERSION = 1


def latroute_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("latroute")
    except PackageNotFoundError:
        return "unknown"


def command_line() -> str:
    """The command line of the running ``latroute`` command (captured by the
    CLI's root group), or the process's argv outside the CLI."""
    import click

    ctx = click.get_current_context(silent=True)
    argv = ctx.find_root().meta.get("latroute.argv") if ctx is not None else None
    if argv is None:
        return shlex.join(sys.argv)
    return shlex.join(["latroute", *argv])


def result_header(kind: str, command: str | None = None) -> dict:
    """The first keys of a result's metrics.json."""
    if kind not in RESULT_KINDS:
        raise ValueError(f"unknown result kind {kind!r}")
    return {"kind": kind, "schema_version": RESULT_SCHEMA_VERSION, "latroute_version": latroute_version(),
            "command": command if command is not None else command_line()}


@dataclass
class Result:
    kind: str
    path: Path
    metrics: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    display: str | None = None  # set by reports.series.assign_labels when folder names collide

    @property
    def label(self) -> str:
        return self.display or self.path.name


def _json(path: Path) -> dict:
    """metrics.json, strictly: NaN and Infinity are refused (traces.files.jsonio),
    so no reader (``check`` above all) meets a metric that compares false
    with everything."""
    doc = read_json(input_file(path, "metrics.json"), "metrics.json")  # no FIFO (a hang), no directory
    if not isinstance(doc, dict):
        raise BadInput(path, 1, "metrics.json", "not a JSON object")
    return doc


def _parquet(path: Path) -> pd.DataFrame:
    input_file(path, path.stem)  # a FIFO named like a table would hang the reader
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for bad files
        raise BadInput(path, None, path.stem, f"not a Parquet file or truncated ({str(e).splitlines()[0]})") from None


def kind_of(path: Path) -> str:
    """The result's declared kind (its metrics.json header), else what its
    files say (results written before the header)."""
    if os.path.lexists(path / "metrics.json"):  # present but not a file: refused, not skipped
        m = _json(path / "metrics.json")
        if "kind" in m:
            if m["kind"] not in RESULT_KINDS:
                raise BadInput(path / "metrics.json", None, "kind", f"unknown result kind {m['kind']!r}")
            version = m.get("schema_version")
            if isinstance(version, bool) or not isinstance(version, int) or version > RESULT_SCHEMA_VERSION:
                raise BadInput(path / "metrics.json", None, "schema_version",
                               f"{m.get('schema_version')!r} is not one this latroute reads "
                               f"(<= {RESULT_SCHEMA_VERSION})")
            return m["kind"]
    if os.path.lexists(path / "results.parquet"):
        return "sweep"
    if os.path.lexists(path / "estimates.parquet"):
        return "estimate"
    if os.path.lexists(path / "metrics.json"):
        m = _json(path / "metrics.json")
        if "decision_agreement" in m:
            return "validate"
        if "ontime_utility" in m:
            return "replay"
    raise BadInput(path, None, "result", "not a result directory of estimate, validate, replay or sweep")


def load_result(path: str | Path) -> Result:
    path = Path(path)
    if not path.is_dir():
        raise BadInput(path, None, "result", "not a directory")
    input_dir(path, "result")
    kind = kind_of(path)
    metrics = _json(path / "metrics.json")
    tables: dict[str, pd.DataFrame] = {}
    if kind == "sweep":
        tables["results"] = _parquet(path / "results.parquet")
    elif kind == "estimate":
        tables["estimates"] = _parquet(path / "estimates.parquet")
    elif kind == "validate" and os.path.lexists(path / "requests.parquet"):
        tables["requests"] = _parquet(path / "requests.parquet")
    elif kind == "replay" and os.path.lexists(path / "served" / "requests.parquet"):
        tables["requests"] = _parquet(path / "served" / "requests.parquet")
    return Result(kind, path, metrics, tables)
