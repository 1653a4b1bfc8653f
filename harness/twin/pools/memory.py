"""Whether the twin's scheduler state for a set of engines fits this machine's memory.

Each twin instance holds its scheduler state (``estimators.engine.state.SchedState``,
``harness.twin.instance``: room for 256 requests); with prefix caching on, that is also a
block table of 256 x (max_model_len / block_size + 1) int64 and the block pool
(``estimators.engine.block_pool``: 72 to 121 bytes per KV block at its peak, measured). The
largest settings latroute accepts (``num_kv_blocks`` up to 2**31 - 1, pools of up to 4,096
replicas) need far more than a machine has: ``--engine num_kv_blocks=2147483647`` once
allocated 16 GiB before it failed, a pool of 4,096 replicas ended in a ``MemoryError`` after
seconds of set-up. The estimate here, against ``MemAvailable`` of ``/proc/meminfo``, refuses
such a set in one line before anything is allocated; where the machine does not say what is
available, nothing is refused.
"""
from __future__ import annotations

from collections.abc import Iterable

from estimators.engine.config import InstanceConfig

TWIN_CAPACITY = 256  # requests an instance's state holds at first (harness.twin.instance)
BYTES_PER_BLOCK = 128  # the block pool's arrays per KV block at their peak (72-121 B measured), rounded up
BYTES_PER_SLOT = 8 * 16  # a request's rows in the scheduler arrays (NF_ASYNC int64 fields and the queues)
SHARE = 0.8  # of the memory available: the rest for Python, Numba's code, the traces and the results


def instance_bytes(cfg: InstanceConfig) -> int:
    """The scheduler state's bytes for one twin instance of ``cfg`` (an estimate from above)."""
    n = TWIN_CAPACITY * BYTES_PER_SLOT
    if cfg.caching:
        n += TWIN_CAPACITY * (-(-cfg.max_model_len // cfg.block_size) + 1) * 8
        n += int(cfg.num_kv_blocks) * BYTES_PER_BLOCK
    return n


def available_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_shortfall(configs: Iterable[InstanceConfig]) -> str | None:
    """Why ``configs`` (one per twin instance) do not fit, in words; None when they do."""
    configs = list(configs)
    need = sum(instance_bytes(c) for c in configs)
    have = available_bytes()
    if have is None or need <= SHARE * have:
        return None
    gib = 2**30
    caching = [c for c in configs if c.caching]
    what = (f"{len(configs)} instance{'s' if len(configs) != 1 else ''}"
            + (f" ({len(caching)} with prefix caching: block tables and up to "
               f"{max(c.num_kv_blocks for c in caching):,} KV blocks each)" if caching else ""))
    return (f"{what} need{'s' if len(configs) == 1 else ''} about {need / gib:,.1f} GiB of scheduler state in the twin, above "
            f"{int(100 * SHARE)}% of the {have / gib:.1f} GiB this machine has available")


def refuse_engine_memory(engine: InstanceConfig, replicas: int) -> None:
    """A request-level command's engine, ``replicas`` times: BadOption naming ``--replicas`` when one
    replica fits and the fleet does not, else ``--engine``."""
    from traces.errors import BadOption

    short = memory_shortfall([engine] * replicas)
    if short is None:
        return
    if replicas > 1 and memory_shortfall([engine]) is None:
        raise BadOption("--replicas", f"{replicas} replicas: {short}")
    raise BadOption("--engine", f"num_kv_blocks={engine.num_kv_blocks}, prefix caching "
                                f"{'on' if engine.caching else 'off'}: {short}; give a smaller --engine num_kv_blocks")
