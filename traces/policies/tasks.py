"""Task definitions of the paper's workload (arXiv 2607.18253, its workload section).

Medians and per-model mean judge accuracies are the paper's; the lognormal
spreads are our defaults (the paper gives none) and can be replaced by
resampling lengths from a real trace (``--lengths-from``).
"""
from __future__ import annotations

from dataclasses import dataclass

# the models of pool qwen3-h100, smallest first
QWEN3_MODELS: tuple[str, ...] = ("qwen3-0.6b", "qwen3-8b", "qwen3-32b")


@dataclass(frozen=True)
class TaskSpec:
    name: str
    prompt_median: float
    prompt_sigma: float  # lognormal sigma of prompt tokens
    output_median: float
    output_sigma: float
    accuracy: tuple[float, ...]  # mean judge accuracy per model in QWEN3_MODELS


TASKS: dict[str, TaskSpec] = {
    t.name: t
    for t in (
        TaskSpec("alpaca", 40, 0.7, 250, 0.6, (0.535, 0.827, 0.889)),
        TaskSpec("govreport", 7000, 0.4, 600, 0.35, (0.290, 0.866, 0.959)),
        TaskSpec("hotpotqa", 1300, 0.3, 80, 0.8, (0.410, 0.883, 0.927)),
        TaskSpec("writingprompts", 40, 0.5, 700, 0.5, (0.177, 0.575, 0.807)),
    )
}

DEFAULT_MIX: dict[str, float] = {name: 0.25 for name in TASKS}

PROMPT_CLIP = (1, 30000)  # keeps every prompt within the pool's context length
OUTPUT_CLIP = (1, 4096)


def parse_mix(text: str) -> dict[str, float]:
    """Parse ``alpaca=.25,govreport=.25`` into normalised weights."""
    mix: dict[str, float] = {}
    if not str(text).strip():
        raise ValueError("empty mix: give NAME=WEIGHT,... (e.g. alpaca=1)")
    for i, part in enumerate((p.strip() for p in str(text).split(",")), 1):
        if not part:  # "alpaca=1,,govreport=1": a dropped entry would silently change the weights
            raise ValueError(f"mix entry {i} is empty")
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep:
            raise ValueError(f"mix entry {part!r} is not NAME=WEIGHT")
        if name in mix:  # alpaca=1,alpaca=2: which one was meant?
            raise ValueError(f"task {name!r} given twice in the mix")
        if name not in TASKS:
            raise ValueError(f"unknown task {name!r} in mix (known: {', '.join(TASKS)})")
        try:
            w = float(value)
        except ValueError:
            raise ValueError(f"weight of {name!r} is not a number: {value!r}") from None
        if not 0 <= w <= 1e12:  # NaN and inf too: normalising them gives NaN weights
            raise ValueError(f"weight of {name!r} must be a number in [0, 1e12], got {value.strip()!r}")
        mix[name] = w
    total = sum(mix.values())
    if not mix or total <= 0:
        raise ValueError("mix needs at least one task with a positive weight")
    return {k: v / total for k, v in mix.items()}
