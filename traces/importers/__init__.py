"""Importers of public trace formats into latroute traces.

Each importer reads its source in chunks (bounded memory), names the file,
row and column of anything it refuses, and writes through a TraceWriter so
a refused input leaves nothing behind.

The request-level formats (vllm-reqstats, vllm-bench, lmbench: logs of an
engine that served the requests) also mark every engine setting given,
inferred or defaulted (``engine_settings``, over
``traces.vllm_releases.defaults``),
refuse engine features the kernel does not model unless accepted
(``unmodelled``), and refuse a run that logged fewer requests than it sent
unless allowed (``completeness``). A multi-turn log's sessions and the
prompt prefixes they imply are rebuilt by ``session_prefix``.

Importers import ``traces`` only (its data model, checks, store, step log,
file boundary and ``traces.vllm_releases``), never the workload or the
policies.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from traces.errors import BadInput
from traces.importers.azure import import_azure
from traces.importers.burstgpt import import_burstgpt
from traces.importers.common import ImportOptions
from traces.importers.lmbench import import_lmbench
from traces.importers.mooncake import import_mooncake
from traces.importers.vllm_bench import import_vllm_bench
from traces.importers.vllm_record import import_vllm_record
from traces.importers.vllm_reqstats import import_vllm_reqstats
from traces.store import TraceWriter

Importer = Callable[[Path, TraceWriter, ImportOptions], list[str]]

IMPORTERS: dict[str, Importer] = {
    "azure": import_azure,
    "burstgpt": import_burstgpt,
    "mooncake": import_mooncake,
    "vllm-bench": import_vllm_bench,
    "lmbench": import_lmbench,
    "vllm-record": import_vllm_record,
    "vllm-reqstats": import_vllm_reqstats,
}


def import_trace(fmt: str, src: str | Path, out: str | Path, opts: ImportOptions | None = None,
                 force: bool = False) -> tuple[dict[str, int], list[str]]:
    """Import ``src`` in format ``fmt`` into the trace directory ``out``.

    Returns the row count per table and the notes to show the user.
    """
    src = Path(src)
    if fmt not in IMPORTERS:
        raise BadInput(src, None, "FORMAT", f"unknown format {fmt!r} (choose from {', '.join(IMPORTERS)})")
    if not src.exists():
        raise BadInput(src, None, "SRC", "does not exist")
    opts = opts or ImportOptions()
    with TraceWriter(out, force=force) as writer:
        notes = IMPORTERS[fmt](src, writer, opts)
        writer.meta.setdefault("source", {})["format"] = fmt
        writer.meta["import_notes"] = notes
    return writer.rows, notes
