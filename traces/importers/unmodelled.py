"""Engine features latroute's kernel does not model, found in a trace's source.

A request-level trace replays on one twin engine: vLLM V1's FCFS scheduler
over one KV cache, no draft model, no adapters, no second tier of KV. A
deployment that ran data parallelism (N engine cores behind vLLM's
balancer), expert parallelism, speculative decoding, LoRA, KV offload or
LMCache, a prefill/decode connector or the priority policy served its
requests differently, and a vLLM release outside the window whose
scheduling rules latroute checked (``traces.vllm_releases.versions``)
scheduled them by rules nobody compared with the kernel; replaying it as
one plain engine would give numbers that look like the deployment's and
are not.

So such a setting is refused at import, by name, unless the user accepts
it (``trace import --accept-unmodelled KEY``); an accepted one is written
to the trace's ``meta.json`` (``engine.not_modelled``, and its key in
``engine.accepted_unmodelled``) so that every result made from the trace
can say what it leaves out.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from traces.datamodel.limits import shown
from traces.errors import BadInput, BadOption
from traces.vllm_releases.versions import window_text

# KEY (what --accept-unmodelled takes): what it is, and what the replay does instead
UNMODELLED: dict[str, tuple[str, str]] = {
    "data_parallel_size": ("data parallelism: N engine cores behind vLLM's own balancer",
                           "replayed as one engine with one rank's max_num_seqs"),
    "enable_expert_parallel": ("expert parallelism: MoE ranks that step together",
                               "replayed as one engine"),
    "speculative_config": ("speculative decoding: several tokens per step from a draft",
                           "replayed one token per decode step"),
    "enable_lora": ("LoRA adapters", "replayed without adapter loading or batching limits"),
    "kv_offloading": ("KV offload to CPU memory", "replayed with the GPU KV cache only"),
    "lmcache": ("LMCache: a KV cache tier outside the engine, shared or offloaded",
                "replayed with the engine's own prefix cache only"),
    "kv_transfer_config": ("a KV connector (prefill/decode disaggregation)", "replayed as one aggregated engine"),
    "ec_transfer_config": ("an encoder-cache connector", "replayed without it"),
    "policy": ("the priority scheduling policy", "replayed first come, first served"),
    "decode_context_parallel_size": ("decode context parallelism", "replayed without it"),
    "prefill_context_parallel_size": ("prefill context parallelism", "replayed without it"),
    "scheduler_reserve_full_isl": ("admission without reserving the whole prompt's blocks",
                                   "replayed with the reservation (vLLM's default)"),
    "max_num_partial_prefills": ("several partial prefills per step", "replayed with one"),
    "max_long_partial_prefills": ("several long partial prefills per step", "replayed with one"),
    "scheduler_cls": ("a custom scheduler class", "replayed with vLLM V1's scheduler"),
    "max_num_scheduled_tokens": ("a scheduled-token cap below the batch budget", "replayed with the budget"),
    "stream_interval": ("output streamed every N tokens", "replayed streaming every token"),
    "vllm_version": (f"a vLLM release outside the window whose scheduling rules latroute checked ({window_text()})",
                     "replayed with the rules of the nearest checked release"),
}


@dataclass(frozen=True)
class Found:
    """One unmodelled setting as the source states it."""

    key: str  # a key of UNMODELLED
    where: str  # the field that says it (e.g. resolved_config.parallel_config.data_parallel_size)
    value: object
    instead: str = ""  # what the replay does, when more precise than UNMODELLED's

    def text(self) -> str:
        what, instead = UNMODELLED[self.key]
        return f"{self.where} = {_fmt(self.value)}: {what} ({self.instead or instead})"


def _fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else shown(v, 60) if not isinstance(v, (int, float, str)) else str(v)


def check_accept_keys(keys: tuple[str, ...] | list[str]) -> list[str]:
    """``--accept-unmodelled`` keys, each one latroute knows (BadOption otherwise)."""
    out = []
    for k in keys:
        key = str(k).strip().replace("-", "_")
        if key not in UNMODELLED:
            raise BadOption("--accept-unmodelled", f"{k!r} is not one of {', '.join(UNMODELLED)}")
        out.append(key)
    return out


def settle(found: list[Found], accepted: list[str], path: str | Path) -> tuple[list[str], list[str], list[str]]:
    """Refuse the first setting found and not accepted; return (not_modelled lines, accepted keys present,
    notes for accepted keys the source does not set)."""
    for f in found:
        if f.key not in accepted:
            what, _ = UNMODELLED[f.key]
            raise BadInput(path, None, f.where, f"{_fmt(f.value)}: {what} is not modelled by latroute's engine; "
                                                f"give --accept-unmodelled {f.key} to import the run anyway (every "
                                                "result from the trace then says what it leaves out)")
    seen: list[str] = []
    lines: list[str] = []
    for f in found:
        if f.key not in seen:
            seen.append(f.key)
        lines.append(f.text())
    notes = [f"--accept-unmodelled {k}: the source sets no such thing" for k in accepted if k not in seen]
    return lines, seen, notes
