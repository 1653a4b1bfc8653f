"""The engine configuration of a vLLM per-request-stats run (``meta.json``).

A request-level trace replays on one twin instance, so its settings
(``InstanceConfig``'s names) decide every result. Each setting is, in
this order (``traces.importers.engine_settings`` marks and assembles them):

1. given: ``--engine KEY=VALUE`` at import;
2. given: the file: vLLM's resolved configuration (``resolved_config``),
   its ``kv_cache`` section, the engine arguments (``engine_kwargs``), the
   version and the device (``hardware.device_name``);
3. inferred from the run itself (KV blocks from ``kv_cache_pct`` and the
   tokens the requests held, ``traces.importers.reqstats_kv``);
4. defaulted: vLLM's documented default for the run's version on its GPU
   (``traces.vllm_releases.defaults``).

``gpus`` is tensor x pipeline x data parallel size. A setting the kernel
does not model (data or expert parallelism, speculative decoding, LoRA, KV
offload or a KV connector, the priority policy, a scheduler option other
than the one the kernel follows) is refused by name unless accepted
(``traces.importers.unmodelled``).
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from traces.datamodel.limits import shown
from traces.errors import BadInput
from traces.importers.engine_settings import GIVEN, EngineConfig, Stated, assemble, checked
from traces.importers.unmodelled import Found

# resolved_config paths and engine_kwargs keys that name each setting, most specific first
FILE_KEYS: dict[str, tuple[tuple[str, ...], ...]] = {
    "num_kv_blocks": (("kv_cache", "num_gpu_blocks"), ("resolved_config", "cache_config", "num_gpu_blocks")),
    "block_size": (("kv_cache", "block_size"), ("resolved_config", "cache_config", "block_size"),
                   ("engine_kwargs", "block_size")),
    "max_num_batched_tokens": (("resolved_config", "scheduler_config", "max_num_batched_tokens"),
                               ("engine_kwargs", "max_num_batched_tokens")),
    "max_num_seqs": (("resolved_config", "scheduler_config", "max_num_seqs"), ("engine_kwargs", "max_num_seqs")),
    "chunked_prefill": (("resolved_config", "scheduler_config", "enable_chunked_prefill"),
                        ("engine_kwargs", "enable_chunked_prefill")),
    "prefix_caching": (("kv_cache", "enable_prefix_caching"), ("resolved_config", "cache_config", "enable_prefix_caching"),
                       ("engine_kwargs", "enable_prefix_caching")),
    "async_scheduling": (("resolved_config", "scheduler_config", "async_scheduling"),
                         ("engine_kwargs", "async_scheduling")),
    "max_model_len": (("resolved_config", "model_config", "max_model_len"), ("engine_kwargs", "max_model_len")),
    "long_prefill_token_threshold": (("resolved_config", "scheduler_config", "long_prefill_token_threshold"),
                                     ("engine_kwargs", "long_prefill_token_threshold")),
    "vllm_version": (("vllm_version",),),
    "gpu": (("hardware", "device_name"),),
    "tensor_parallel_size": (("resolved_config", "parallel_config", "tensor_parallel_size"),
                             ("engine_kwargs", "tensor_parallel_size")),
    "pipeline_parallel_size": (("resolved_config", "parallel_config", "pipeline_parallel_size"),
                               ("engine_kwargs", "pipeline_parallel_size")),
    "data_parallel_size": (("resolved_config", "parallel_config", "data_parallel_size"),
                           ("engine_kwargs", "data_parallel_size")),
}
KNOWN_POLICIES = ("fcfs", "priority")  # vLLM's SchedulerConfig.policy choices
# scheduler settings with the value the kernel follows: another value is not modelled
MODELLED_SCHEDULER = {"scheduler_reserve_full_isl": True, "max_num_partial_prefills": 1,
                      "max_long_partial_prefills": 1, "scheduler_cls": None, "max_num_scheduled_tokens": None,
                      "stream_interval": 1}
RC, EK = "resolved_config", "engine_kwargs"


def _set(v) -> bool:
    return v is not None and v != {} and v != [] and v is not False and v != ""


def _above_one(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 1


# unmodelled features: key, the fields that state it, and when a value there is the feature
FEATURES: tuple[tuple[str, tuple[tuple[str, ...], ...], object], ...] = (
    ("data_parallel_size", ((RC, "parallel_config", "data_parallel_size"), (EK, "data_parallel_size")), _above_one),
    ("enable_expert_parallel", ((RC, "parallel_config", "enable_expert_parallel"), (EK, "enable_expert_parallel")),
     lambda v: v is True),
    ("speculative_config", ((RC, "speculative_config"), (EK, "speculative_config")), _set),
    ("speculative_config", ((EK, "num_speculative_tokens"),), lambda v: isinstance(v, int) and v > 0),
    ("enable_lora", ((RC, "lora_config"),), _set),
    ("enable_lora", ((EK, "enable_lora"),), lambda v: v is True),
    ("kv_offloading", ((RC, "cache_config", "kv_offloading_size"), (EK, "kv_offloading_size")),
     lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0),
    ("kv_transfer_config", ((RC, "kv_transfer_config"), (EK, "kv_transfer_config")), _set),
    ("ec_transfer_config", ((RC, "ec_transfer_config"), (EK, "ec_transfer_config")), _set),
    ("decode_context_parallel_size", ((RC, "parallel_config", "decode_context_parallel_size"),
                                      (EK, "decode_context_parallel_size")), _above_one),
    ("prefill_context_parallel_size", ((RC, "parallel_config", "prefill_context_parallel_size"),
                                       (EK, "prefill_context_parallel_size")), _above_one),
)


def _lookup(doc: dict, path: tuple[str, ...]):
    cur = doc
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


def unmodelled_features(meta: dict, path: Path) -> list[Found]:
    """What the run's meta.json sets that the kernel does not model (the first field stating each)."""
    found: list[Found] = []
    for key, paths, is_feature in FEATURES:
        for p in paths:
            v = _lookup(meta, p)
            if is_feature(v) and not any(f.key == key for f in found):
                if key == "kv_transfer_config" and "lmcache" in str(v).lower():
                    key = "lmcache"  # LMCache's connector: a KV tier of its own
                found.append(Found(key, ".".join(p), v))
                break
    return found + _scheduler_features(meta, path)


def _scheduler_features(meta: dict, path: Path) -> list[Found]:
    """The policy (an unknown one refused outright) and the scheduler options the kernel follows."""
    sched = _lookup(meta, (RC, "scheduler_config"))
    kwargs = meta.get(EK) if isinstance(meta.get(EK), dict) else {}
    if isinstance(sched, dict):
        policy, where = sched.get("policy", "fcfs"), f"{RC}.scheduler_config.policy"
    else:
        policy, where = kwargs.get("policy", kwargs.get("scheduling_policy")), f"{EK}.policy"
    found: list[Found] = []
    if policy is not None and policy != "fcfs":
        if policy not in KNOWN_POLICIES:
            raise BadInput(path, None, where, f"unknown scheduler policy {shown(policy)} (vLLM has "
                                              f"{', '.join(KNOWN_POLICIES)}; the kernel models fcfs)")
        found.append(Found("policy", where, policy))
    for key, modelled in MODELLED_SCHEDULER.items():
        for doc, prefix in ((sched, f"{RC}.scheduler_config"), (kwargs, EK)):
            if isinstance(doc, dict) and key in doc and doc[key] != modelled:
                found.append(Found(key, f"{prefix}.{key}", doc[key]))
                break
    return found


SECTIONS = ("engine_kwargs", "resolved_config", "kv_cache", "hardware")  # JSON objects when present (null: not saved)


def check_sections(meta: dict, path: Path) -> None:
    """meta.json's sections, when present, are JSON objects: a list or a text there would be read as
    "states nothing" (and a later reader's ``.get`` fails on it)."""
    for key in SECTIONS:
        v = meta.get(key)
        if v is not None and not isinstance(v, dict):
            raise BadInput(path, None, key, f"must be a JSON object (or null: not saved), got {shown(v)}")


def stated_settings(meta: dict, path: Path) -> dict[str, Stated]:
    """Every setting the file states (given), from its most specific field."""
    check_sections(meta, path)
    out: dict[str, Stated] = {}
    for key, paths in FILE_KEYS.items():
        for p in paths:
            v = _lookup(meta, p)
            if v is not None:
                out[key] = Stated(checked(key, v, ".".join(p), path), GIVEN, f"{path.name} {'.'.join(p)}")
                break
    return out


def engine_config(meta: dict, path: Path, overrides: dict, longest_tokens: int, accepted: list[str],
                  infer_kv) -> EngineConfig:
    """Every setting marked; ``infer_kv(block_size)`` gives (blocks, how) when the run shows its KV size."""
    day = str(meta.get("started_at") or "")[:10]
    return assemble(stated_settings(meta, path), overrides, longest_tokens, path,
                    unmodelled_features(meta, path), accepted, infer_kv,
                    run_date=day if re.match(r"^\d{4}-\d{2}-\d{2}$", day) else None)


def kv_from_usage(pct: list[float], held_blocks: list[float]) -> tuple[int, str] | None:
    """KV blocks from the logger's usage and the blocks the requests held at the same instants:
    the median of held / usage over samples where usage is between 10% and 95% (clipped samples
    at 100% and near-empty ones say little). None when no sample qualifies."""
    ratios = sorted(h / (p / 100.0) for p, h in zip(pct, held_blocks) if 10.0 <= p <= 95.0 and h > 0)
    if not ratios:
        return None
    mid = ratios[len(ratios) // 2] if len(ratios) % 2 else 0.5 * (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2])
    return int(math.ceil(mid)), f"median of {len(ratios)} samples"
