"""``InstanceConfig``: the one configuration of a serving instance.

Everything that describes an instance lives here once: the engine settings
the scheduler kernel reads (``to_array``), the identity and prices a pool
gives it, its defaults, its ``instances`` row (``to_row`` / ``from_row``;
the data layer, which imports no engine, spells the same columns out in
``traces.datamodel.schema.INSTANCES``, and tests/project/test_import_layers.py checks that they
agree with ``instance_fields``) and its pool-file entry (``load_pool``
accepts exactly these fields). Adding an engine setting is one field here
(with its ``meta``), its column in ``traces.datamodel.schema`` and its use in the
kernel.

Defaults are vLLM 0.32's for ``vllm serve`` on a GPU without a special
case in ``EngineArgs`` (``_set_default_max_num_seqs_and_batched_tokens``:
``max_num_batched_tokens`` 2048, ``max_num_seqs`` 256; block size 16;
chunked prefill on; no long-prefill cap; V1 keeps no watermark), because
the twin's job is to behave as an engine started with the same flags.
``max_model_len`` has no engine-wide default in vLLM (it is the model's
context length): 40960 is Qwen3's, the family of the built-in pool, and a
row that does not say (0 or absent) gets it too. ``num_kv_blocks`` is
derived from memory by vLLM; 20000 blocks of 16 tokens is a mid-size GPU.
Pools and recordings state their own values.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields

import numpy as np

from estimators.engine.layout import (
    C_ASYNC,
    C_BLOCK,
    C_BUDGET,
    C_CHUNKED,
    C_LONG_PREFILL,
    C_MAX_LEN,
    C_MAX_SEQS,
    C_NUM_BLOCKS,
    C_POLICY,
    C_PREFIX,
    C_RULES,
    C_SCHED_PRIORITY,
    C_WATERMARK,
    NC,
)
from estimators.engine.releases import KERNEL_VERSION, in_window, rules_of, version_key, window_text

# engine settings are int64 in the kernel, which multiplies blocks by block size: the data layer
# refuses the same (traces.datamodel.limits.MAX_ENGINE; tests/project/test_import_layers.py checks they agree)
MAX_ENGINE = 2**31 - 1


def shown(cell: object, width: int = 40) -> str:
    """A value for an error message: repr, cut to ``width`` characters."""
    text = repr(cell)
    return text if len(text) <= width else f"{text[:width - 8]}...({len(text)} chars)"


MAX_PRICE = 1e6  # USD per million tokens: beyond any price, and far from a float's overflow in cost sums
MAX_HOST_SPEED = 1e3  # true step time / the profile's


def _float(v: object) -> float:
    """``v`` as a float; NaN (refused by the caller's range) for an integer too large for one."""
    try:
        return float(v)  # type: ignore[arg-type]
    except OverflowError:
        return math.nan


POLICIES = {"vllm-v1": 0, "sarathi": 1, "vllm-v0": 2}
SCHEDULING_POLICIES = {"fcfs": 0, "priority": 1}  # vLLM's --scheduling-policy (SchedulingPolicy)
DEFAULT_WATERMARK = {"vllm-v1": 0.0, "sarathi": 0.01, "vllm-v0": 0.01}


def meta(doc: str = "", required: bool = False, nullable: bool = True, nonneg: bool = True, positive: bool = False,
         choices: tuple[str, ...] | None = None) -> dict:
    """Column metadata of a field in the ``instances`` table."""
    return {"doc": doc, "required": required, "nullable": nullable, "nonneg": nonneg, "positive": positive,
            "choices": choices}


def _setting(doc: str = "", required: bool = True, nullable: bool = False) -> dict:
    """An engine count the kernel divides or allocates by: a positive int."""
    return meta(doc, required=required, nullable=nullable, positive=True)


POSITIVE_SETTINGS = ("max_num_batched_tokens", "max_num_seqs", "block_size", "num_kv_blocks", "max_model_len")


@dataclass(frozen=True)
class InstanceConfig:
    """One serving instance: identity, prices, profile and engine settings."""

    instance_id: str = field(default="i0", metadata=meta(required=True, nullable=False))
    model: str = field(default="", metadata=meta(required=True, nullable=False))
    gpus: int = field(default=1, metadata=meta("accelerators used (0 = CPU)", required=True, nullable=False))
    policy: str = field(default="vllm-v1", metadata=meta("vllm-v1 | sarathi | vllm-v0", required=True,
                                                         nullable=False, choices=tuple(POLICIES)))
    max_num_batched_tokens: int = field(default=2048, metadata=_setting())
    max_num_seqs: int = field(default=256, metadata=_setting())
    block_size: int = field(default=16, metadata=_setting())
    num_kv_blocks: int = field(default=20_000, metadata=_setting())
    price_in: float = field(default=0.0, metadata=meta("USD per million prompt tokens", required=True))
    price_out: float = field(default=0.0, metadata=meta("USD per million output tokens", required=True))
    profile: str = field(default="", metadata=meta("batch-time profile name or path", required=True))
    long_prefill_token_threshold: int = field(default=0, metadata=meta("0 = off"))
    max_model_len: int = field(default=40960, metadata=meta("requests finish when prompt + output reach it; "
                                                            "0 or empty = 40960"))
    chunked_prefill: bool = field(default=True, metadata=meta())
    watermark: float | None = field(default=None, metadata=meta(
        "fraction of KV blocks kept free at admission; empty = the policy's (V1 0, Sarathi and V0 1%)"))
    prefix_caching: bool | None = field(default=None, metadata=meta(
        "vLLM's enable_prefix_caching; empty = the policy's (V1 on, as vLLM; Sarathi and V0 off)"))
    device: str | None = field(default=None, metadata=meta())
    host_speed: float | None = field(default=None, metadata=meta(
        "the twin's true step time / the profile's (1.45 = a host 45% slower than the profile says; estimators "
        "keep the profile); empty = 1"))
    async_scheduling: bool = field(default=False, metadata=meta(
        "vLLM's async scheduling (AsyncScheduler, two-deep batch queue; vllm-v1 only); off = the synchronous "
        "scheduler (vLLM on CPU, and the built-in pools)"))
    vllm_version: str = field(default=KERNEL_VERSION, metadata=meta(
        f"the vLLM release whose scheduling rules the kernel follows ({window_text()}); empty = {KERNEL_VERSION}"))
    scheduling_policy: str = field(default="fcfs", metadata=meta(
        f"vLLM's --scheduling-policy: fcfs | priority (a request's priority, lower first, orders waiting and "
        f"picks the preemption victim; vllm-v1 at vLLM {KERNEL_VERSION} only); empty = fcfs",
        choices=tuple(SCHEDULING_POLICIES)))

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r} (choose from {', '.join(POLICIES)})")
        for name in POSITIVE_SETTINGS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 < v <= MAX_ENGINE:
                raise ValueError(f"{name} must be a whole number in [1, {MAX_ENGINE}], got {shown(v)}")
        for name in ("gpus", "long_prefill_token_threshold"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v <= MAX_ENGINE:
                raise ValueError(f"{name} must be a whole number in [0, {MAX_ENGINE}], got {shown(v)}")
        for name in ("price_in", "price_out"):  # NaN: unknown (recordings); never negative, infinite or absurd
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (
                    (isinstance(v, float) and math.isnan(v)) or 0 <= _float(v) <= MAX_PRICE):
                raise ValueError(f"{name} must be a number of USD per million tokens in [0, {MAX_PRICE:g}], "
                                 f"got {shown(v)}")
        if not isinstance(self.chunked_prefill, (bool, np.bool_)):
            raise ValueError(f"chunked_prefill must be true or false, got {shown(self.chunked_prefill)}")
        if not isinstance(self.async_scheduling, (bool, np.bool_)):
            raise ValueError(f"async_scheduling must be true or false, got {shown(self.async_scheduling)}")
        if self.async_scheduling and self.policy != "vllm-v1":
            raise ValueError(f"async_scheduling is vLLM V1's (policy vllm-v1), not {self.policy}'s")
        if self.prefix_caching is not None and not isinstance(self.prefix_caching, (bool, np.bool_)):
            raise ValueError(f"prefix_caching must be true, false or null, got {shown(self.prefix_caching)}")
        if self.device is not None and not isinstance(self.device, str):
            raise ValueError(f"device must be a string or null, got {shown(self.device)}")
        if not isinstance(self.vllm_version, str) or not in_window(self.vllm_version):
            raise ValueError(f"vllm_version {shown(self.vllm_version)} is outside the releases whose scheduling "
                             f"rules latroute models ({window_text()})")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"unknown scheduling_policy {shown(self.scheduling_policy)} (choose from "
                             f"{', '.join(SCHEDULING_POLICIES)})")
        if self.scheduling_policy == "priority" and self.policy != "vllm-v1":
            raise ValueError(f"scheduling_policy priority is vLLM V1's (policy vllm-v1), not {self.policy}'s")
        if self.scheduling_policy == "priority" and version_key(self.vllm_version)[:2] != version_key(KERNEL_VERSION)[:2]:
            # the priority rules are checked against vLLM 0.32's scheduler only (tests/peer/fixtures/0.32.0/priority)
            raise ValueError(f"scheduling_policy priority follows vLLM {KERNEL_VERSION}'s rules only, not "
                             f"vllm_version {self.vllm_version}'s")
        for name in ("instance_id", "model", "profile"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be a string, got {shown(getattr(self, name))}")
        if self.watermark is not None and (isinstance(self.watermark, bool) or not isinstance(self.watermark, (int, float))
                                           or not 0.0 <= self.watermark < 1.0):
            raise ValueError(f"watermark must be a fraction in [0, 1), got {self.watermark!r}")
        if self.host_speed is not None and (isinstance(self.host_speed, bool) or not isinstance(self.host_speed, (int, float))
                                            or not 0 < _float(self.host_speed) <= MAX_HOST_SPEED):
            raise ValueError(f"host_speed must be a positive number up to {MAX_HOST_SPEED:g}, "
                             f"got {shown(self.host_speed)}")

    @property
    def chunked(self) -> bool:
        return self.chunked_prefill and self.policy != "vllm-v0"

    @property
    def speed(self) -> float:
        """The host's true step time relative to the profile (``host_speed``, default 1)."""
        return 1.0 if self.host_speed is None else float(self.host_speed)

    @property
    def caching(self) -> bool:
        """Prefix caching on: vLLM V1 turns it on by default."""
        return self.policy == "vllm-v1" if self.prefix_caching is None else bool(self.prefix_caching)

    @property
    def watermark_fraction(self) -> float:
        return DEFAULT_WATERMARK[self.policy] if self.watermark is None else float(self.watermark)

    def to_array(self) -> np.ndarray:
        """The kernel's ``cfg`` array; refuses what vLLM refuses."""
        if not self.chunked and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError(f"without chunked prefill max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                             f">= max_model_len ({self.max_model_len}), as vLLM requires")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError("max_num_batched_tokens must be >= max_num_seqs, as vLLM requires")
        cfg = np.zeros(NC, dtype=np.int64)
        cfg[C_POLICY] = POLICIES[self.policy]
        cfg[C_BUDGET] = self.max_num_batched_tokens
        cfg[C_MAX_SEQS] = self.max_num_seqs
        cfg[C_BLOCK] = self.block_size
        cfg[C_NUM_BLOCKS] = self.num_kv_blocks
        cfg[C_LONG_PREFILL] = self.long_prefill_token_threshold
        cfg[C_CHUNKED] = 1 if self.chunked else 0
        cfg[C_MAX_LEN] = self.max_model_len
        cfg[C_WATERMARK] = int(self.watermark_fraction * self.num_kv_blocks)
        cfg[C_PREFIX] = 1 if self.caching else 0
        cfg[C_ASYNC] = 1 if self.async_scheduling else 0
        cfg[C_RULES] = rules_of(self.vllm_version)
        cfg[C_SCHED_PRIORITY] = SCHEDULING_POLICIES[self.scheduling_policy]
        return cfg

    # --- the instances table and pool files
    def to_row(self) -> dict:
        row = asdict(self)
        row["model"] = self.model or self.instance_id
        for name, kind, _ in instance_fields():
            if kind == "float" and row[name] is None:
                row[name] = np.nan  # an empty cell: the default applies when read back
        return row

    @classmethod
    def from_row(cls, row: Mapping) -> InstanceConfig:
        """From an ``instances`` row (a dict or pandas Series); absent or
        empty cells take the defaults."""
        kw = {}
        for f in fields(cls):
            if f.name not in row:
                continue
            v = row[f.name]
            kind = f.type if isinstance(f.type, str) else f.type.__name__
            missing = v is None or (isinstance(v, float) and math.isnan(v))
            # empty cells take the default; a float without a None default keeps its NaN (unknown prices)
            if (missing and (kind != "float" or f.default is None)) or (f.name == "max_model_len" and v == 0) \
                    or (f.name in ("vllm_version", "scheduling_policy") and v == ""):
                continue
            if kind.startswith("int"):
                v = int(v)
            elif kind.startswith("float"):
                v = float(v)
            elif kind.startswith("bool"):
                v = bool(v)
            else:
                v = str(v)
            kw[f.name] = v
        return cls(**kw)

    @classmethod
    def from_table(cls, instances, instance_id: str) -> InstanceConfig:
        """The row of ``instance_id`` in an ``instances`` DataFrame."""
        return cls.from_row(instances.set_index("instance_id", drop=False).loc[instance_id])


def instance_fields() -> list[tuple[str, str, dict]]:
    """(name, kind, column metadata) of every field: ``traces.datamodel.schema.INSTANCES``
    has one column per field, as this says (tests/project/test_import_layers.py). Kind is
    int, float, str or bool."""
    out = []
    for f in fields(InstanceConfig):
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        out.append((f.name, kind.split(" ")[0].split("|")[0].strip(), dict(f.metadata)))
    return out


def instances_table(configs) -> pd.DataFrame:  # noqa: F821
    import pandas as pd

    return pd.DataFrame([c.to_row() for c in configs])
