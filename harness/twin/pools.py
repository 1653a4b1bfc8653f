"""Pools of serving instances: engine configuration, prices and the
batch-time profile of each instance. ``qwen3-h100`` reproduces the paper's
setup (DESIGN section 5); other pools are JSON files of the same shape::

    {"name": "...", "frontend_overhead_s": 0.005,
     "instances": [{"instance_id", "model", "profile", ...}, ...]}

where an instance takes any field of ``estimators.engine.config.InstanceConfig``
(``policy``, ``max_num_batched_tokens``, ``max_num_seqs``, ``block_size``,
``num_kv_blocks``, ``watermark``, ``max_model_len``, prices, ...); absent
fields take its defaults.

Limits (refused at load with the file, entry row and key): engine counts
whole numbers in [1, 2^31 - 1]; prices USD per million tokens in [0, 1e6];
``host_speed`` in (0, 1000]; ``chunked_prefill`` and ``prefix_caching``
JSON booleans; what vLLM itself refuses (``InstanceConfig.to_array``); the
file read through ``traces.paths`` (no FIFOs or devices, UTF-8).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from estimators.engine.config import InstanceConfig
from estimators.profile import read_json_input
from traces.errors import BadInput
from traces.limits import shown


@dataclass(frozen=True)
class Pool:
    name: str
    instances: tuple[InstanceConfig, ...]
    frontend_overhead_s: float = 0.0  # API/front-end time added to every TTFT
    notes: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"name": self.name, "frontend_overhead_s": self.frontend_overhead_s,
                "instances": [asdict(i) for i in self.instances], "notes": self.notes}


H100_KV_TOKENS = {"qwen3-0.6b": 600_000, "qwen3-8b": 370_000, "qwen3-32b": 320_000}


def _qwen3_h100() -> Pool:
    rows = [("qwen3-0.6b", 1, 0.044, 0.173), ("qwen3-8b", 1, 0.072, 0.287), ("qwen3-32b", 2, 0.287, 0.640)]
    return Pool(
        name="qwen3-h100",
        frontend_overhead_s=0.005,
        instances=tuple(InstanceConfig(instance_id=m, model=m, profile=f"{m}-h100", gpus=g, price_in=pi,
                                       price_out=po, num_kv_blocks=H100_KV_TOKENS[m] // 16,
                                       max_num_batched_tokens=32768, max_num_seqs=512, max_model_len=40960,
                                       prefix_caching=False)  # the paper's setting, said explicitly
                        for m, g, pi, po in rows),
        notes={"source": "DESIGN section 5", "kv": "bf16, 90% of memory after weights, block size 16",
               "prefix_caching": False},
    )


def _qwen3_h100_pc() -> Pool:
    """qwen3-h100 with prefix caching on, as ``vllm serve`` runs by default:
    for workloads that share prefixes (sessions, system prompts, hash_ids)."""
    base = _qwen3_h100()
    return replace(base, name="qwen3-h100-pc",
                   instances=tuple(replace(c, prefix_caching=True) for c in base.instances),
                   notes={**base.notes, "prefix_caching": True})


BUILTIN_POOLS = {"qwen3-h100": _qwen3_h100, "qwen3-h100-pc": _qwen3_h100_pc}


def _named_key(message: str, entry: dict) -> str:
    """The key of a pool entry an ``InstanceConfig`` refusal names (its
    messages start with the field's name), else ``instances``."""
    first = message.split(" ", 1)[0]
    return f"instances.{first}" if first in entry else "instances"


def load_pool(name_or_path: str | Path) -> Pool:
    key = str(name_or_path)
    if key in BUILTIN_POOLS:
        return BUILTIN_POOLS[key]()
    path = Path(key)
    if not os.path.lexists(path):
        raise BadInput(path, None, "pool", f"no such file and not a built-in pool (built-in: {', '.join(BUILTIN_POOLS)})")
    doc = read_json_input(path, "pool")
    if not isinstance(doc, dict) or not isinstance(doc.get("instances"), list) or not doc["instances"]:
        raise BadInput(path, None, "instances", "missing or empty list")
    known = {f.name for f in fields(InstanceConfig)}
    instances = []
    for i, inst in enumerate(doc["instances"], start=1):
        if not isinstance(inst, dict):
            raise BadInput(path, i, "instances", "not an object")
        for key_ in ("instance_id", "model", "profile"):
            if key_ not in inst:
                raise BadInput(path, i, key_, "missing key")
        unknown = set(inst) - known
        if unknown:
            raise BadInput(path, i, sorted(unknown)[0], "unknown key")
        try:
            cfg = InstanceConfig(**inst)
            cfg.to_array()  # what vLLM refuses (chunked prefill off with a budget under max_model_len, ...)
        except (TypeError, ValueError, OverflowError) as e:
            raise BadInput(path, i, _named_key(str(e), inst), str(e)) from None
        instances.append(cfg)
    ids = [c.instance_id for c in instances]
    for i, iid in enumerate(ids, start=1):
        if ids.index(iid) != i - 1:
            raise BadInput(path, i, "instance_id", f"duplicate instance id {iid!r}")
    overhead = doc.get("frontend_overhead_s", 0.0)
    if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not 0 <= overhead <= 3600:
        raise BadInput(path, None, "frontend_overhead_s", f"must be seconds in [0, 3600], got {shown(overhead)}")
    name = doc.get("name", path.stem)
    if not isinstance(name, str):
        raise BadInput(path, None, "name", f"must be a string, got {shown(name)}")
    notes = doc.get("notes") or {}
    if not isinstance(notes, dict):
        raise BadInput(path, None, "notes", "must be an object")
    return Pool(name=name, instances=tuple(instances), frontend_overhead_s=float(overhead), notes=notes)
