"""Recording files: a writer thread, rotation by size, and the close step.

Why a thread: the engine's busy loop must not wait on formatting or disk.
The scheduler hands plain tuples to a ``queue.SimpleQueue`` (a C-level
append, well under a microsecond); this thread turns them into JSON/CSV,
hashes prompt blocks and writes. It flushes whenever the queue runs dry, so
a killed server loses at most the lines of the last moments.

Why rotation: a server runs for days. Lines go to numbered parts
(``steps.00000.jsonl``, ``requests.00000.csv``, ...), a new part once the
current one passes ``rotate_bytes``, so each file stays small enough to ship
or inspect while the server runs. The close step (``finish_recording``, run
on scheduler shutdown and at exit, or later by ``latroute record finish DIR``
after a crash; ``finish``) joins the parts into the single ``steps.jsonl`` and
``requests.csv`` of ``shared/data/vllm_cpu``'s format, requests sorted by
arrival as the importer requires, so ``latroute trace import vllm-record``
reads a recording unchanged (the importer is not taught about parts).
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
import queue
import threading
from array import array
from pathlib import Path

REQUEST_FIELDS = ("id", "arrival_s", "added_s", "prompt_tokens", "output_tokens", "first_token_s", "finish_s",
                  "ttft_s", "hash_ids", "cached_tokens", "client_id", "status")
DEFAULT_ROTATE_BYTES = 64 << 20
_STOP = object()


class BlockIds:
    """Chained prompt-block hashes as small integers (1, 2, ... in order of
    first appearance): equal ids mean equal tokens on an equal prefix, the
    meaning of ``hash_ids`` in d8-d10 and Mooncake. Keys are 16-byte blake2b
    digests of (previous id, block tokens), so memory is ~100 B per distinct
    block."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}

    def of(self, token_ids: list[int], block_tokens: int) -> list[int]:
        out: list[int] = []
        prev = 0
        for k in range(len(token_ids) // block_tokens):
            block = array("q", token_ids[k * block_tokens:(k + 1) * block_tokens]).tobytes()
            key = hashlib.blake2b(prev.to_bytes(8, "little") + block, digest_size=16).digest()
            prev = self._ids.setdefault(key, len(self._ids) + 1)
            out.append(prev)
        return out


class _Parts:
    """One stream of numbered part files (``<stem>.<n>.<ext>``)."""

    def __init__(self, out_dir: Path, stem: str, ext: str, header: str, rotate_bytes: int) -> None:
        self.out_dir, self.stem, self.ext, self.header = out_dir, stem, ext, header
        self.rotate_bytes = rotate_bytes
        self.index = -1
        self.fh: io.TextIOWrapper | None = None
        self.size = 0

    def write(self, text: str) -> None:
        if self.fh is None or self.size >= self.rotate_bytes:
            self._next()
        self.fh.write(text)
        self.size += len(text)

    def _next(self) -> None:
        if self.fh is not None:
            self.fh.close()
        self.index += 1
        self.fh = open(self.out_dir / f"{self.stem}.{self.index:05d}.{self.ext}", "w", buffering=1 << 16)
        self.fh.write(self.header)
        self.size = len(self.header)

    def flush(self) -> None:
        if self.fh is not None:
            self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


class RecordingWriter(threading.Thread):
    """Consumes ``("step", ...)`` and ``("request", ...)`` tuples off the
    scheduling path. ``put`` is all the engine thread ever calls."""

    def __init__(self, out_dir: Path, block_tokens: int, rotate_bytes: int = DEFAULT_ROTATE_BYTES) -> None:
        super().__init__(name="latroute-recorder", daemon=True)
        self.out_dir = Path(out_dir)
        self.block_tokens = block_tokens
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.put = self.queue.put
        self.block_ids = BlockIds()
        self.steps = _Parts(self.out_dir, "steps", "jsonl", "", rotate_bytes)
        self.requests = _Parts(self.out_dir, "requests", "csv", ",".join(REQUEST_FIELDS) + "\n", rotate_bytes)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while True:
                item = self.queue.get()
                if item is _STOP:
                    break
                getattr(self, f"_write_{item[0]}")(*item[1:])
                if self.queue.empty():
                    self.steps.flush()
                    self.requests.flush()
        except BaseException as e:  # never take the engine down; say so at close
            self.error = e
        finally:
            self.steps.close()
            self.requests.close()

    def _write_step(self, step: int, start_s: float, end_s: float, items: list, preempted: list) -> None:
        self.steps.write(json.dumps({"step": step, "start_s": start_s, "end_s": end_s, "items": items,
                                     "preempted": preempted}) + "\n")

    def _write_request(self, row: dict, prompt_ids: list[int] | None) -> None:
        if prompt_ids is not None:
            row["hash_ids"] = " ".join(map(str, self.block_ids.of(prompt_ids, self.block_tokens)))
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(["" if row.get(f) is None else row[f] for f in REQUEST_FIELDS])
        self.requests.write(buf.getvalue())

    def stop(self) -> None:
        self.put(_STOP)
        self.join()


def finish_recording(out_dir: str | Path) -> dict:
    """Join the parts of ``out_dir`` into ``steps.jsonl`` and ``requests.csv``
    (requests sorted by arrival) and remove the parts once the joined files
    are written and verified; refuses (BadInput, nothing removed) a part
    that is a link, a special file or malformed (``finish``)."""
    from traces.vllm_recorder.finish import finish_parts

    return finish_parts(out_dir, list(REQUEST_FIELDS))
