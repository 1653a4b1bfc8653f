"""The random async fixtures' file: every scenario of
``scenarios.random_async_scenarios`` with vLLM's record of it, one JSON line
per scenario, gzip-compressed (``fixtures/<version>/async_random.jsonl.gz``,
``releases.random_path``).

Why one compressed file and not one JSON file per scenario like the other
fixtures: there are hundreds, and the default suite reads them all; a step
is an array in ``STEP_FIELDS`` order instead of an object, which keeps the
file small. ``unpack`` turns a line back into the other fixtures' form, so
the same comparison checks them. Standard library only: both the generator
(in vLLM's environment) and the tests import it.
"""
from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

FORMAT = "latroute-vllm-peer-random/1"
STEP_FIELDS = ("step", "batch", "preempted", "running", "waiting", "free_blocks_scheduled", "completed",
               "finished", "free_blocks")
REQUEST_FIELDS = ("id", "prompt", "max_tokens", "arrival_step", "blocks")


def pack(sc: dict, result: dict, vllm_version: str) -> str:
    """One scenario and vLLM's record of it as one JSON line."""
    head = {k: v for k, v in sc.items() if k != "requests"}
    line = {"format": FORMAT, "vllm_version": vllm_version, **head, "start": result["start"],
            "finish_reasons": result["finish_reasons"],
            "requests": [[r.get(k) for k in REQUEST_FIELDS] for r in sc["requests"]],
            "steps": [[st[k] for k in STEP_FIELDS] for st in result["steps"]]}
    return json.dumps(line, separators=(",", ":"))


def unpack(line: str) -> dict:
    """A line as a fixture in the one-file-per-scenario form (``async_scheduling`` true)."""
    fx = json.loads(line)
    if fx.pop("format") != FORMAT:
        raise ValueError(f"{fx.get('name')}: not a {FORMAT} record")
    fx["requests"] = [{k: v for k, v in zip(REQUEST_FIELDS, r) if not (k == "blocks" and v is None)}
                      for r in fx["requests"]]
    fx["steps"] = [dict(zip(STEP_FIELDS, st)) for st in fx["steps"]]
    fx["async_scheduling"] = True
    return fx


def write(path: Path, lines: list[str]) -> None:
    """The lines, gzip-compressed with no timestamp or name (same lines, same bytes)."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as f:
        f.write("".join(line + "\n" for line in lines).encode())
    path.write_bytes(buf.getvalue())


def read_text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode()


def load_all(path: Path) -> list[dict]:
    return [unpack(line) for line in read_text(path).splitlines()]
