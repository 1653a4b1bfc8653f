"""A sweep's output directory, written as the sweep runs, so a study
survives Ctrl-C, a crash or a killed driver.

Layout::

    OUT/.latroute-sweep     marker: latroute wrote this directory (--force may replace it)
    OUT/sweep.json          the full specification (spec + every cell)
    OUT/INCOMPLETE          present until every cell is done
    OUT/cells/<key>.parquet one part per finished cell: its result row
    OUT/cells/<key>.timing.json  that cell's wall time (kept apart: timings differ run to run)
    OUT/results.parquet, OUT/timings.parquet, OUT/metrics.json   written when the sweep completes

A part is written to a temporary name and renamed, so a killed run leaves
whole parts or none. ``--resume`` checks that the specification on disk is
the one asked for (else exit 2 naming both) and runs only the cells without
a part; the final results do not depend on how many runs it took, since each
cell is fully determined by its parameters.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from traces.errors import BadInput

MARKER = ".latroute-sweep"
SPEC_FILE = "sweep.json"
INCOMPLETE = "INCOMPLETE"
CELLS = "cells"
SPEC_VERSION = 1


def cell_key(cell) -> str:
    """A stable name for a cell: a hash of its parameters."""
    doc = json.dumps(asdict(cell), sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:20]


def _atomic_bytes(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class SweepStore:
    """Opens (or creates) OUT for a sweep of ``spec_doc`` (JSON-able)."""

    def __init__(self, out: str | Path, spec_doc: dict, resume: bool = False, force: bool = False):
        self.out = Path(out)
        self.spec_doc = {"spec_version": SPEC_VERSION, **spec_doc}
        if self.out.exists() or self.out.is_symlink():
            self._open_existing(resume, force)
        else:
            self._create()

    # --- opening
    def _create(self) -> None:
        self.out.mkdir(parents=True)
        (self.out / MARKER).write_text("latroute sweep output\n")
        (self.out / CELLS).mkdir()
        (self.out / INCOMPLETE).write_text("")
        _atomic_bytes(self.out / SPEC_FILE,
                      lambda p: Path(p).write_text(json.dumps(self.spec_doc, indent=2, sort_keys=True) + "\n"))

    def _ours(self) -> bool:
        return self.out.is_dir() and not self.out.is_symlink() and (self.out / MARKER).is_file()

    def _open_existing(self, resume: bool, force: bool) -> None:
        if force:
            if not self._ours():
                raise BadInput(self.out, None, "--out", "exists and was not written by a latroute sweep: "
                               "--force replaces only a sweep's own output")
            shutil.rmtree(self.out)
            self._create()
            return
        if not self._ours():
            raise BadInput(self.out, None, "--out", "already exists")
        on_disk = self._spec_on_disk()
        if resume:
            if on_disk != self.spec_doc:
                raise BadInput(self.out / SPEC_FILE, None, "specification",
                               "differs from this sweep's (--resume continues only the same sweep; "
                               "--force replaces it)")
            (self.out / CELLS).mkdir(exist_ok=True)
            return
        state = "an incomplete sweep" if (self.out / INCOMPLETE).exists() else "a finished sweep"
        raise BadInput(self.out, None, "--out", f"holds {state}: pass --resume to continue it or --force to replace it")

    def _spec_on_disk(self) -> dict:
        path = self.out / SPEC_FILE
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            raise BadInput(path, None, "specification", "missing or not valid JSON") from None

    # --- cells
    def done(self) -> set[str]:
        return {p.name[: -len(".parquet")] for p in (self.out / CELLS).glob("*.parquet")}

    def write_cell(self, key: str, row: dict, timing: dict) -> None:
        cells = self.out / CELLS
        _atomic_bytes(cells / f"{key}.timing.json", lambda p: Path(p).write_text(json.dumps(timing) + "\n"))
        _atomic_bytes(cells / f"{key}.parquet", lambda p: pd.DataFrame([row]).to_parquet(p, index=False))

    def rows(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Every finished cell's result row and timing row."""
        cells = sorted((self.out / CELLS).glob("*.parquet"))
        res = pd.concat([pd.read_parquet(p) for p in cells], ignore_index=True) if cells else pd.DataFrame()
        tim = pd.DataFrame([{"cell": p.name[: -len(".parquet")],
                             **json.loads((p.parent / f"{p.name[: -len('.parquet')]}.timing.json").read_text())}
                            for p in cells])
        return res, tim

    def finish(self, files: dict[str, callable]) -> None:
        """Write the final files (name -> writer(path)) and clear INCOMPLETE."""
        for name, write in files.items():
            _atomic_bytes(self.out / name, write)
        (self.out / INCOMPLETE).unlink(missing_ok=True)
