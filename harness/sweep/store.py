"""A sweep's output directory, written as the sweep runs, so a study
survives Ctrl-C, a crash or a killed driver.

Layout::

    OUT/.latroute           marker: latroute wrote this directory, kind "sweep" (--force may replace it;
                            sweeps written before it carry .latroute-sweep)
    OUT/sweep.json          the full specification (spec + every cell)
    OUT/INCOMPLETE          present until every cell is done
    OUT/cells/<key>.parquet one part per finished cell: its result row
    OUT/cells/<key>.timing.json  that cell's wall time (kept apart: timings differ run to run)
    OUT/results.parquet, OUT/timings.parquet, OUT/metrics.json   written when the sweep completes

A part is written to a temporary name carrying the writer's pid and
renamed, so a killed run leaves whole parts or none (and the next run
removes the killed run's temporary files). The output lock of
``traces.files.outputs`` is held from opening to ``finish``, so two sweeps never
write one OUT at once; ``--force`` replaces only a directory latroute wrote,
moving it aside under a temporary name first (never half-deleted). ``--resume`` checks that the specification on disk is
the one asked for (else exit 2 naming both) and runs only the cells without
a part; the final results do not depend on how many runs it took, since each
cell is fully determined by its parameters.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from harness.sweep.parts import check_cells, check_final_files, read_part, read_timing
from traces.errors import BadInput
from traces.files.jsonio import dump_json, read_json
from traces.files.outputs import (
    MARKER,
    OutputLock,
    check_out,
    clean_debris,
    clean_debris_in,
    dir_kind,
    honour_umask,
    temp_prefix,
)
from traces.files.paths import input_file

SPEC_FILE = "sweep.json"
INCOMPLETE = "INCOMPLETE"
CELLS = "cells"
SPEC_VERSION = 1
KIND = "sweep"
FINAL_FILES = (SPEC_FILE, "results.parquet", "metrics.parquet", "timings.parquet", "metrics.json")


def cell_key(cell) -> str:
    """A stable name for a cell: a hash of its parameters."""
    doc = json.dumps(asdict(cell), sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:20]


def _atomic_bytes(path: Path, write: Callable[[str], Any]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        honour_umask(Path(tmp), directory=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _nonempty_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not path.is_symlink() and any(os.scandir(path))
    except OSError:
        return True


def check_sweep_out(out: str | Path, resume: bool, force: bool, inputs: Iterable[Any] = (), held: bool = False
                    ) -> Path:
    """Refuse, before any work, an OUT a sweep may not write: everything
    ``traces.files.outputs.check_out`` refuses, a directory latroute did not
    write, and an existing sweep without --resume or --force (one line
    naming both)."""
    out = Path(out)
    check_out(out, force=True, kind="dir", inputs=inputs, owner="a latroute sweep", held=held)
    if _nonempty_dir(out) and force and not resume and dir_kind(out) == KIND:
        _refuse_strangers(out)
    if _nonempty_dir(out) and not force:
        kind = dir_kind(out)
        if kind != KIND:
            raise BadInput(out, None, "--out", f"holds a latroute {kind} output, not a sweep (--force replaces it)")
        if not resume:
            state = "an incomplete sweep" if (out / INCOMPLETE).exists() else "a finished sweep"
            raise BadInput(out, None, "--out", f"holds {state}: pass --resume to continue it or --force to "
                           "replace it")
    return out


_PART = re.compile(r"[0-9a-f]{20}\.(parquet|timing\.json)")
_TEMPORARY = re.compile(r"\..+\.tmp-\d+-.*")


def _refuse_strangers(out: Path) -> None:
    """``--force`` replaces a sweep, not what a user put into its directory
    since: a sweep writes in place (no manifest of names, unlike staged
    outputs), so every entry must be one a sweep writes, or the replacement
    is refused naming it."""
    own = {MARKER, INCOMPLETE, CELLS, *FINAL_FILES}
    for entry in sorted(os.listdir(out)):
        if entry in own or _TEMPORARY.fullmatch(entry):
            if entry == CELLS and (out / CELLS).is_dir() and not (out / CELLS).is_symlink():
                for part in sorted(os.listdir(out / CELLS)):
                    if not (_PART.fullmatch(part) or _TEMPORARY.fullmatch(part)):
                        raise BadInput(out, None, "--out", f"holds {out / CELLS / part}, which no sweep writes: "
                                       "--force replaces only what latroute wrote (move it out first)")
            continue
        raise BadInput(out, None, "--out", f"holds {out / entry}, which no sweep writes: --force replaces only "
                       "what latroute wrote (move it out first)")


class SweepStore:
    """Opens (or creates) OUT for a sweep of ``spec_doc`` (JSON-able),
    holding OUT's output lock until ``finish`` or ``close``."""

    def __init__(self, out: str | Path, spec_doc: dict, resume: bool = False, force: bool = False,
                 inputs: Iterable[Any] = ()):
        self.out = check_sweep_out(out, resume, force, inputs)
        self.spec_doc = {"spec_version": SPEC_VERSION, **spec_doc}
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.lock = OutputLock(self.out)
        try:
            check_sweep_out(self.out, resume, force, inputs, held=True)  # again, now that we own it
            clean_debris(self.out)
            if _nonempty_dir(self.out):
                self._open_existing(resume, force)
            else:
                self._create()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release OUT's lock (the kernel does it too if the process dies)."""
        self.lock.release()

    # --- opening
    def _create(self) -> None:
        self.out.mkdir(exist_ok=True)
        (self.out / MARKER).write_text(f"{KIND}\n")  # first: whatever a kill leaves is recognisably ours
        (self.out / INCOMPLETE).write_text("")
        (self.out / CELLS).mkdir()
        _atomic_bytes(self.out / SPEC_FILE,
                      lambda p: Path(p).write_text(dump_json(self.spec_doc, indent=2, sort_keys=True) + "\n"))

    def _open_existing(self, resume: bool, force: bool) -> None:
        if force:
            aside = Path(tempfile.mkdtemp(prefix=temp_prefix(self.out.name), dir=self.out.parent))
            os.rename(self.out, aside / "old")  # aside carries this pid: a kill now leaves debris the next run removes
            self._create()
            shutil.rmtree(aside, ignore_errors=True)
            return
        on_disk = self._spec_on_disk()
        if on_disk != self.spec_doc:
            raise BadInput(self.out / SPEC_FILE, None, "specification",
                           "differs from this sweep's (--resume continues only the same sweep; "
                           "--force replaces it)")
        check_final_files(self.out, (MARKER, INCOMPLETE, *FINAL_FILES))  # before any work: see harness.sweep.parts
        check_cells(self.out / CELLS, self.spec_doc)
        (self.out / CELLS).mkdir(exist_ok=True)
        clean_debris_in(self.out / CELLS)  # parts a killed run was writing
        (self.out / INCOMPLETE).write_text("")

    def _spec_on_disk(self) -> dict:
        path = self.out / SPEC_FILE
        if not os.path.lexists(path):
            raise BadInput(path, None, "specification", "missing (--force replaces this sweep)")
        doc = read_json(input_file(path, "specification"), "specification")
        if not isinstance(doc, dict) or not isinstance(doc.get("cells"), list) \
                or not all(isinstance(c, dict) for c in doc["cells"]) or not isinstance(doc.get("spec"), dict):
            raise BadInput(path, None, "specification", "not a sweep specification (spec and cells); "
                           "--force replaces this sweep")
        return doc

    # --- cells
    def done(self) -> set[str]:
        return {p.name[: -len(".parquet")] for p in (self.out / CELLS).glob("*.parquet")
                if not p.name.startswith(".")}

    def write_cell(self, key: str, row: dict, timing: dict) -> None:
        cells = self.out / CELLS
        _atomic_bytes(cells / f"{key}.timing.json", lambda p: Path(p).write_text(dump_json(timing) + "\n"))
        _atomic_bytes(cells / f"{key}.parquet", lambda p: pd.DataFrame([row]).to_parquet(p, index=False))

    def rows(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """Every finished cell's result row and timing row."""
        cells = sorted(p for p in (self.out / CELLS).glob("*.parquet") if not p.name.startswith("."))
        res = pd.concat([read_part(p) for p in cells], ignore_index=True) if cells else pd.DataFrame()
        tim = pd.DataFrame([{"cell": p.name[: -len(".parquet")],
                             **read_timing(p.parent / f"{p.name[: -len('.parquet')]}.timing.json")}
                            for p in cells])
        return res, tim

    def finish(self, files: dict[str, Callable[[str], Any]]) -> None:
        """Write the final files (name -> writer(path)), clear INCOMPLETE and release the lock."""
        try:
            for name, write in files.items():
                _atomic_bytes(self.out / name, write)
            (self.out / INCOMPLETE).unlink(missing_ok=True)
        finally:
            self.close()
