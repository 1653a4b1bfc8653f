"""Reading result directories written by ``estimate``, ``validate``,
``replay`` and ``sweep``: each is recognised by what it contains."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from traces.errors import BadInput


@dataclass
class Result:
    kind: str
    path: Path
    metrics: dict
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.path.name


def _json(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(path, None, "metrics.json", f"cannot be read ({e})") from None
    except json.JSONDecodeError as e:
        raise BadInput(path, e.lineno, "metrics.json", f"not valid JSON ({e.msg})") from None
    if not isinstance(doc, dict):
        raise BadInput(path, 1, "metrics.json", "not a JSON object")
    return doc


def _parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for bad files
        raise BadInput(path, None, path.stem, f"not a Parquet file or truncated ({str(e).splitlines()[0]})") from None


def kind_of(path: Path) -> str:
    if (path / "results.parquet").is_file():
        return "sweep"
    if (path / "estimates.parquet").is_file():
        return "estimate"
    if (path / "metrics.json").is_file():
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
    kind = kind_of(path)
    metrics = _json(path / "metrics.json")
    tables: dict[str, pd.DataFrame] = {}
    if kind == "sweep":
        tables["results"] = _parquet(path / "results.parquet")
    elif kind == "estimate":
        tables["estimates"] = _parquet(path / "estimates.parquet")
    elif kind == "validate" and (path / "requests.parquet").is_file():
        tables["requests"] = _parquet(path / "requests.parquet")
    elif kind == "replay" and (path / "served" / "requests.parquet").is_file():
        tables["requests"] = _parquet(path / "served" / "requests.parquet")
    return Result(kind, path, metrics, tables)
