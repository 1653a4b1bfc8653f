"""The engine configuration of a vLLM per-request-stats run (``meta.json``).

A request-level trace replays on one twin instance, so its settings
(``InstanceConfig``'s names) decide every result. Each setting comes from,
in this order:

1. ``--engine KEY=VALUE`` given to the import;
2. the file: vLLM's resolved configuration (``resolved_config``), its
   ``kv_cache`` section, or the engine arguments (``engine_kwargs``);
3. inferred from the run itself (KV blocks from ``kv_cache_pct`` and the
   tokens the requests held, ``traces.importers.reqstats_kv``);
4. vLLM 0.19's documented default on a GPU (``VLLM_019_GPU_DEFAULTS``).

Where each came from is printed at import and kept in the trace's
``meta.json`` (``engine.sources``). A scheduler setting the kernel does not
model is named (``engine.not_modelled``); a scheduler policy other than
``fcfs`` (the kernel's only one) is refused.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from traces.errors import BadInput
from traces.limits import MAX_ENGINE, shown

# vLLM 0.19 on a CUDA GPU (SchedulerConfig / CacheConfig / EngineArgs defaults; ../shared/reference/
# vllm_v1_scheduler.md lists the same for the version the kernel follows): block size 16 on CUDA, chunked
# prefill and prefix caching on in V1, async scheduling auto-enabled on GPUs (only the CPU platform forces it
# off), the OpenAI server's budget 2048 and 256 sequences on a GPU that is not an H100/H200, FCFS
DEFAULT_SOURCE = "vLLM 0.19 default (GPU)"
VLLM_019_GPU_DEFAULTS: dict = {
    "block_size": 16, "chunked_prefill": True, "prefix_caching": True, "async_scheduling": True,
    "max_num_batched_tokens": 2048, "max_num_seqs": 256, "long_prefill_token_threshold": 0,
}
UNKNOWN_CONTEXT = 40960  # InstanceConfig's max_model_len default (Qwen3's context); used when the file says null
SETTINGS = ("num_kv_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "chunked_prefill",
            "prefix_caching", "async_scheduling", "max_model_len", "long_prefill_token_threshold", "gpus")
BOOL_SETTINGS = {"chunked_prefill", "prefix_caching", "async_scheduling"}
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
    "gpus": (("resolved_config", "parallel_config", "world_size"), ("engine_kwargs", "tensor_parallel_size")),
}
KNOWN_POLICIES = ("fcfs", "priority")  # vLLM's SchedulerConfig.policy choices
# scheduler settings with the value the kernel follows: another value is named as not modelled
MODELLED_SCHEDULER = {"scheduler_reserve_full_isl": True, "max_num_partial_prefills": 1,
                      "max_long_partial_prefills": 1, "scheduler_cls": None, "max_num_scheduled_tokens": None,
                      "stream_interval": 1}

@dataclass
class EngineConfig:
    """The settings, where each came from, and what the kernel cannot model."""

    settings: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    not_modelled: list = field(default_factory=list)

    def set(self, key: str, value, source: str) -> None:
        self.settings[key] = value
        self.sources[key] = source

    def lines(self) -> list[str]:
        return [f"engine {k} = {_fmt(self.settings[k])}  ({self.sources[k]})" for k in SETTINGS if k in self.settings] \
            + [f"not modelled: {w}" for w in self.not_modelled]

    def to_meta(self) -> dict:
        return {"settings": dict(self.settings), "sources": dict(self.sources), "not_modelled": list(self.not_modelled)}


def _fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _lookup(doc: dict, path: tuple[str, ...]):
    cur = doc
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    return cur


def _checked(key: str, value, where: str, path: Path):
    """A setting's value as the kernel takes it: a bool, or a whole number in [0 or 1, MAX_ENGINE]."""
    if key in BOOL_SETTINGS:
        if not isinstance(value, bool):
            raise BadInput(path, None, where, f"must be true or false, got {shown(value)}")
        return value
    low = 0 if key == "long_prefill_token_threshold" else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_ENGINE:
        raise BadInput(path, None, where, f"must be a whole number in [{low}, {MAX_ENGINE}], got {shown(value)}")
    return value


def parse_engine_overrides(items: tuple[str, ...] | list[str]) -> dict:
    """``--engine KEY=VALUE`` of the import (KEY one of ``SETTINGS``)."""
    out: dict = {}
    for item in items:
        key, sep, raw = str(item).partition("=")
        key = key.strip().replace("-", "_")
        raw = raw.strip()
        if not sep or key not in SETTINGS:
            raise BadInput("--engine", None, "--engine", f"{item!r} is not KEY=VALUE with KEY one of {', '.join(SETTINGS)}")
        if key in BOOL_SETTINGS:
            if raw.lower() not in ("1", "0", "true", "false", "on", "off"):
                raise BadInput("--engine", None, "--engine", f"{key}: {raw!r} is not true or false")
            out[key] = raw.lower() in ("1", "true", "on")
        else:
            try:
                out[key] = _checked(key, int(raw), key, Path("--engine"))
            except (ValueError, BadInput):
                raise BadInput("--engine", None, "--engine", f"{key}: {raw!r} is not a whole number in "
                                                             f"[0, {MAX_ENGINE}]") from None
    return out


def check_scheduler(meta: dict, path: Path, cfg: EngineConfig) -> None:
    """The resolved scheduler settings the kernel follows; refuse an unknown or unmodelled policy, name the rest."""
    sched = _lookup(meta, ("resolved_config", "scheduler_config"))
    policy = sched.get("policy", "fcfs") if isinstance(sched, dict) else meta.get("engine_kwargs", {}).get("policy")
    if policy is not None and policy != "fcfs":
        where = "resolved_config.scheduler_config.policy" if isinstance(sched, dict) else "engine_kwargs.policy"
        if policy not in KNOWN_POLICIES:
            raise BadInput(path, None, where, f"unknown scheduler policy {shown(policy)} (vLLM has "
                                              f"{', '.join(KNOWN_POLICIES)}; the kernel models fcfs)")
        raise BadInput(path, None, where, f"scheduler policy {shown(policy)}: the kernel models fcfs only")
    if not isinstance(sched, dict):
        return
    for key, modelled in MODELLED_SCHEDULER.items():
        if key in sched and sched[key] != modelled:
            cfg.not_modelled.append(f"scheduler_config.{key} = {_fmt(sched[key])} (the kernel follows "
                                    f"{_fmt(modelled)})")


def engine_config(meta: dict, path: Path, overrides: dict, infer_kv) -> EngineConfig:
    """Every setting with its source; ``infer_kv(block_size)`` gives (blocks, how) when the file has no KV size."""
    cfg = EngineConfig()
    check_scheduler(meta, path, cfg)
    for key in SETTINGS:
        if key == "num_kv_blocks":
            continue  # after block_size, which the inference needs
        _resolve(cfg, meta, path, overrides, key)
    if "num_kv_blocks" in overrides:
        cfg.set("num_kv_blocks", overrides["num_kv_blocks"], "--engine")
    elif (found := _from_file(meta, path, "num_kv_blocks")) is not None:
        cfg.set("num_kv_blocks", *found)
    else:
        blocks, how = infer_kv(int(cfg.settings["block_size"]))
        cfg.set("num_kv_blocks", blocks, f"inferred: {how}")
    return cfg


def _from_file(meta: dict, path: Path, key: str):
    for p in FILE_KEYS[key]:
        v = _lookup(meta, p)
        if v is not None:
            return _checked(key, v, ".".join(p), path), f"{path.name} {'.'.join(p)}"
    return None


def _resolve(cfg: EngineConfig, meta: dict, path: Path, overrides: dict, key: str) -> None:
    if key in overrides:
        cfg.set(key, overrides[key], "--engine")
    elif (found := _from_file(meta, path, key)) is not None:
        cfg.set(key, *found)
    elif key in VLLM_019_GPU_DEFAULTS:
        cfg.set(key, VLLM_019_GPU_DEFAULTS[key], DEFAULT_SOURCE)
    elif key == "gpus":
        cfg.set(key, 1, DEFAULT_SOURCE + ": tensor_parallel_size 1")
    elif key == "max_model_len":
        cfg.set(key, UNKNOWN_CONTEXT, "not given (null: vLLM takes the model's context length, which the file "
                                      f"does not state): {UNKNOWN_CONTEXT}, InstanceConfig's default")


def kv_from_usage(pct: list[float], held_blocks: list[float]) -> tuple[int, str] | None:
    """KV blocks from the logger's usage and the blocks the requests held at the same instants:
    the median of held / usage over samples where usage is between 10% and 95% (clipped samples
    at 100% and near-empty ones say little). None when no sample qualifies."""
    ratios = sorted(h / (p / 100.0) for p, h in zip(pct, held_blocks) if 10.0 <= p <= 95.0 and h > 0)
    if not ratios:
        return None
    mid = ratios[len(ratios) // 2] if len(ratios) % 2 else 0.5 * (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2])
    return int(math.ceil(mid)), f"median of {len(ratios)} samples"
