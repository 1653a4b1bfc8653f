"""Where latroute writes its outputs.

Every output is built beside its final place and renamed into it only when
complete, so a crash or a refused input never leaves a half-written result
behind (sweeps are the one resumable output: ``harness/sweep_store.py``).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from traces.errors import BadInput

if TYPE_CHECKING:
    import pandas as pd


def atomic_write_text(path: Path, text: str) -> None:
    """Write a small text file atomically (temp file in the same directory,
    then rename)."""
    path = Path(path)
    if path.exists() and not path.is_file():
        # a device or pipe (e.g. /dev/null, /dev/stdout): write through, never replace it
        with open(path, "w") as f:
            f.write(text)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class StagedDir:
    """An output directory built beside its final place and renamed into it
    only when complete (``with StagedDir(out) as tmp: ...``). On any
    exception the staging directory is removed and ``out`` is untouched; an
    existing ``out`` is replaced only with ``force``."""

    def __init__(self, out: str | Path, force: bool = False):
        self.out = Path(out)
        if self.out.exists() and not force and (not self.out.is_dir() or any(self.out.iterdir())):
            raise BadInput(self.out, None, "--out", "already exists (pass --force to replace it)")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-", dir=self.out.parent))

    def __enter__(self) -> Path:
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        self.commit()

    def commit(self) -> None:
        old = None
        if self.out.exists():
            old = self.out.with_name(f".{self.out.name}.old-{os.getpid()}")
            os.replace(self.out, old)
        os.replace(self.tmp, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def write_json(path: Path, doc: Any) -> None:
    """JSON with NaN written as null (strict JSON readers reject NaN)."""
    def clean(v: Any) -> Any:
        if isinstance(v, float) and v != v:
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    atomic_write_text(Path(path), json.dumps(clean(doc), indent=2, default=str) + "\n")


def write_parquet(path: Path, df: pd.DataFrame) -> None:
    """A results table (not a trace table): plain Parquet, no pandas metadata."""
    table = pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)
    pq.write_table(table, path, compression="zstd")
