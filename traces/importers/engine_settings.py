"""The engine of a request-level trace, every setting marked.

A request log (vLLM's per-request stats, a ``vllm bench serve`` result, an
LMBench CSV) is replayed on a twin engine whose settings decide every
result, and the log states few of them. Each setting is therefore one of

- **given**: the source states it (a field of its file, or ``--engine
  KEY=VALUE`` at import);
- **inferred**: derived from the run, saying how (the KV size from the
  logger's usage, the GPU count from a label);
- **defaulted**: what vLLM does when nobody sets it, for the trace's vLLM
  version on its GPU class (``traces.vllm_releases.defaults``, each with the line of
  vLLM's source it comes from), or, where vLLM has no fixed default (the KV
  cache size, the context length), the assumption taken and why.

``vllm_version`` is given when the source (or ``--engine``) states it and
otherwise defaulted to the newest release whose scheduling rules latroute
checked (the engine defaults still follow the release the run's date
bounds); a stated version outside that window
(``traces.vllm_releases.versions``) is refused by name unless accepted as
unmodelled, and is then replayed with the nearest checked release's rules.

The import prints every setting with its mark and writes them to the
trace's ``meta.json`` ``engine`` (``settings``, ``marks``, ``sources``);
a setting the kernel does not model is settled by
``traces.importers.unmodelled`` (``not_modelled``, ``accepted_unmodelled``).
The harness replays the given and inferred settings over a profile's
fitted engine and the defaulted ones under it
(``harness.requestlevel.engine_options``).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from traces.datamodel.limits import MAX_ENGINE, shown
from traces.errors import BadInput, BadOption
from traces.importers.unmodelled import Found, settle
from traces.vllm_releases.defaults import NO_VERSION, engine_defaults, gpu_class, release_for
from traces.vllm_releases.versions import NEWEST_CHECKED, in_window, nearest_in_window

GIVEN, INFERRED, DEFAULTED = "given", "inferred", "defaulted"
MARKS = (GIVEN, INFERRED, DEFAULTED)
DEPLOYMENT = ("vllm_version", "gpu", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
KERNEL = ("num_kv_blocks", "block_size", "max_num_batched_tokens", "max_num_seqs", "chunked_prefill",
          "prefix_caching", "async_scheduling", "max_model_len", "long_prefill_token_threshold", "gpus")
SETTINGS = DEPLOYMENT + KERNEL
BOOL_SETTINGS = {"chunked_prefill", "prefix_caching", "async_scheduling"}
TEXT_SETTINGS = {"vllm_version", "gpu"}
CONTEXT_TAKEN = 131_072  # Llama-3.x's and most current models' context: taken when a source states none


@dataclass(frozen=True)
class Stated:
    """A setting the source states or implies."""

    value: object
    mark: str  # GIVEN or INFERRED
    how: str


@dataclass
class EngineConfig:
    """The settings, how each is known, and what the kernel does not model."""

    settings: dict = field(default_factory=dict)
    sources: dict = field(default_factory=dict)
    marks: dict = field(default_factory=dict)
    not_modelled: list = field(default_factory=list)
    accepted: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    def set(self, key: str, value, mark: str, how: str) -> None:
        assert mark in MARKS, mark
        self.settings[key] = value
        self.marks[key] = mark
        self.sources[key] = how

    def lines(self) -> list[str]:
        return [f"engine {k} = {_fmt(self.settings[k])}  [{self.marks[k]}] {self.sources[k]}"
                for k in SETTINGS if k in self.settings] \
            + [f"engine not modelled, accepted: {w}" for w in self.not_modelled] + self.notes

    def to_meta(self) -> dict:
        return {"settings": dict(self.settings), "marks": dict(self.marks), "sources": dict(self.sources),
                "not_modelled": list(self.not_modelled), "accepted_unmodelled": list(self.accepted)}


def _fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def checked(key: str, value, where: str, path: str | Path):
    """A setting's value as the kernel takes it: a bool, a text (version, GPU), or a whole number in
    [0 or 1, MAX_ENGINE]."""
    if key in BOOL_SETTINGS:
        if not isinstance(value, bool):
            raise BadInput(path, None, where, f"must be true or false, got {shown(value)}")
        return value
    if key in TEXT_SETTINGS:
        if not isinstance(value, str) or not value.strip() or len(value) > 200:
            raise BadInput(path, None, where, f"must be a non-empty text, got {shown(value)}")
        return value.strip()
    low = 0 if key == "long_prefill_token_threshold" else 1
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_ENGINE:
        raise BadInput(path, None, where, f"must be a whole number in [{low}, {MAX_ENGINE}], got {shown(value)}")
    return value


def parse_engine_overrides(items: tuple[str, ...] | list[str]) -> dict:
    """``trace import --engine KEY=VALUE`` (KEY one of ``SETTINGS``): what the user knows of the engine."""
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
        elif key in TEXT_SETTINGS:
            out[key] = checked(key, raw, "--engine", "--engine")
        else:
            try:
                out[key] = checked(key, int(raw), key, Path("--engine"))
            except (ValueError, BadInput):
                raise BadInput("--engine", None, "--engine", f"{key}: {raw!r} is not a whole number in "
                                                             f"[0, {MAX_ENGINE}]") from None
    return out


def found_in_settings(settings: dict, source: str) -> list[Found]:
    """Unmodelled values among the deployment settings themselves (a data-parallel size above 1, as
    ``--engine`` or a label gave it)."""
    dp = settings.get("data_parallel_size")
    where = "--engine data_parallel_size" if source == "--engine" else "data_parallel_size"
    return [Found("data_parallel_size", where, dp)] if isinstance(dp, int) and dp > 1 else []


def _version_outside_window(cfg: EngineConfig, path: str | Path) -> list[Found]:
    """A stated vLLM version whose scheduling rules latroute did not check (before the window, after it, or
    no version at all): unmodelled, named by the field or option that states it."""
    version = cfg.settings.get("vllm_version")
    if version is None or in_window(version):
        return []
    where = "--engine vllm_version" if cfg.sources["vllm_version"] == "--engine" else _field(cfg, "vllm_version", path)
    return [Found("vllm_version", where, version,
                  f"replayed with the rules of {nearest_in_window(version)}, the nearest checked release")]


def assemble(stated: dict[str, Stated], overrides: dict, longest_tokens: int, path: str | Path,
             found: list[Found] = (), accepted: list[str] = (),
             infer_kv: Callable[[int], tuple[int, str] | None] | None = None,
             run_date: str | None = None) -> EngineConfig:
    """Every setting of ``SETTINGS`` with its mark: ``--engine`` overrides (given), what the source states or
    implies, then vLLM's defaults for the trace's version and GPU; the KV size from ``infer_kv(block_size)``
    when it can tell, else taken large enough never to bind. With no version stated the scheduling rules
    are the newest checked release's (defaulted) while the run's date (``YYYY-MM-DD``) still bounds the
    release whose engine defaults apply. Unmodelled settings (``found``, a data-parallel size above 1
    however stated, a vLLM version outside the checked window) are refused unless ``accepted``."""
    cfg = EngineConfig()
    for key, value in overrides.items():
        cfg.set(key, value, GIVEN, "--engine")
    for key, s in stated.items():
        if key not in cfg.settings:
            cfg.set(key, s.value, s.mark, s.how)
    found = list(found)
    if not any(f.key == "data_parallel_size" for f in found):
        found += found_in_settings(cfg.settings, cfg.sources.get("data_parallel_size", ""))
    found += _version_outside_window(cfg, path)
    lines, seen, notes = settle(found, list(accepted), path)
    cfg.not_modelled, cfg.accepted, cfg.notes = lines, seen, list(notes)
    choice = release_for(cfg.settings.get("vllm_version"), run_date)
    if "vllm_version" not in cfg.settings:
        how = (f"the source states no vLLM version: the scheduling rules are {NEWEST_CHECKED}'s, the newest "
               "release latroute checked")
        if choice.inferred or choice.release.version != NEWEST_CHECKED:
            how += "; engine defaults below from " + choice.how.removeprefix(NO_VERSION + "; ")
        cfg.set("vllm_version", NEWEST_CHECKED, DEFAULTED, how)
    elif choice.release.version != cfg.settings["vllm_version"]:
        cfg.sources["vllm_version"] += f"; defaults below from {choice.how}"
    gpu = gpu_class(cfg.settings.get("gpu"))
    if "gpu" not in cfg.settings:
        cfg.set("gpu", "unknown", DEFAULTED, "the source names no GPU: vLLM's row for a device it cannot query")
    elif gpu.memory_gib is None:
        cfg.sources["gpu"] += " (a GPU latroute's table does not know: vLLM's row for a device it cannot query)"
    else:
        cfg.sources["gpu"] += f" (class: {gpu.label})"
    for key, d in engine_defaults(choice.release, gpu).items():
        if key not in cfg.settings:
            cfg.set(key, d.value, DEFAULTED, d.source)
    if "gpus" not in cfg.settings:
        parts = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
        weakest = DEFAULTED if any(cfg.marks[p] == DEFAULTED for p in parts) else INFERRED
        n = math.prod(int(cfg.settings[p]) for p in parts)
        cfg.set("gpus", n, weakest, "tensor_parallel_size x pipeline_parallel_size x data_parallel_size = "
                                    + " x ".join(str(cfg.settings[p]) for p in parts))
    if "max_model_len" not in cfg.settings:
        taken = max(CONTEXT_TAKEN, int(longest_tokens) + 1)
        cfg.set("max_model_len", taken, DEFAULTED,
                f"vLLM takes the model's context length, which the source does not state: {taken} taken "
                f"(above the longest request, {int(longest_tokens)} tokens, so none is cut)")
    if "num_kv_blocks" not in cfg.settings:
        block = int(cfg.settings["block_size"])
        got = infer_kv(block) if infer_kv is not None else None
        if got is not None:
            cfg.set("num_kv_blocks", got[0], INFERRED, got[1])
        else:
            seqs = int(cfg.settings["max_num_seqs"])
            longest = max(1, -(-int(longest_tokens) // block))
            cfg.set("num_kv_blocks", min(seqs * longest, MAX_ENGINE), DEFAULTED,
                    "vLLM sizes the KV cache from the GPU memory left after the weights, which the source does "
                    f"not state: taken large enough never to bind (max_num_seqs {seqs} x the longest request's "
                    f"{longest} blocks); give --engine num_kv_blocks=N, or search it in calibration")
    return cfg


def _refuse(cfg: EngineConfig, key: str, path: str | Path, reason: str):
    """The refusal of a setting that cannot be the run's, naming where it came from: ``--engine`` as an
    option, a field of the source file by its path (``engine_kwargs.max_model_len``), else the setting."""
    how = str(cfg.sources.get(key, ""))
    if how == "--engine":
        return BadOption("--engine", f"{key}={_fmt(cfg.settings[key])}: {reason}")
    field_ = _field(cfg, key, path)
    if cfg.marks.get(key) == GIVEN:
        return BadInput(path, None, field_, f"{_fmt(cfg.settings[key])}: {reason}")
    return BadInput(path, None, field_, f"{_fmt(cfg.settings[key])} ({cfg.marks.get(key)}: {how}): {reason}; give "
                                        f"--engine {key}=N")


def _field(cfg: EngineConfig, key: str, path: str | Path) -> str:
    """The field of the source file that gave a setting (its source reads ``<file name> <field>``), else the
    setting's own name."""
    how, name = str(cfg.sources.get(key, "")), Path(path).name
    return how[len(name) + 1:].split(" ")[0] if cfg.marks.get(key) == GIVEN and how.startswith(name + " ") else key


def check_served(cfg: EngineConfig, longest_prompt: int, longest_total: int, path: str | Path) -> None:
    """Settings that could not have served the logged requests, refused at import rather than at the
    first replay (``harness.requestlevel.engine_options.refuse_unservable`` checks a profile's engine the
    same way): a ``max_model_len`` at or below a prompt (vLLM rejects it at the front end), a KV pool
    that cannot hold the largest request whole, a token budget below ``max_num_seqs`` or, without
    chunked prefill, below ``max_model_len`` (vLLM refuses both configurations at start-up). The setting
    the source gave is named (``--engine`` or its field) when a pair disagrees."""
    s = cfg.settings
    mml = int(s["max_model_len"])
    if longest_prompt >= mml:
        raise _refuse(cfg, "max_model_len", path, f"at or below the longest logged prompt ({longest_prompt} "
                                                   "tokens), which vLLM would have rejected; the run served it")
    block = int(s["block_size"])
    need = -(-min(longest_total, mml) // block)
    if need > int(s["num_kv_blocks"]):
        raise _refuse(cfg, "num_kv_blocks", path, f"blocks of {block} tokens cannot hold the largest logged request "
                                                   f"({longest_total} tokens, {need} blocks) whole; the run served it")
    budget, seqs = int(s["max_num_batched_tokens"]), int(s["max_num_seqs"])

    def given_of(*keys: str) -> str:
        return next((k for k in keys if cfg.marks.get(k) == GIVEN), keys[0])

    if budget < seqs:
        raise _refuse(cfg, given_of("max_num_batched_tokens", "max_num_seqs"), path,
                      f"max_num_batched_tokens {budget} is below max_num_seqs {seqs}, which vLLM refuses "
                      "(max_num_seqs <= max_num_batched_tokens)")
    if not s["chunked_prefill"] and budget < mml:
        raise _refuse(cfg, given_of("chunked_prefill", "max_num_batched_tokens"), path,
                      f"without chunked prefill max_num_batched_tokens ({budget}) must be at least max_model_len "
                      f"({mml}), as vLLM requires")


def run_day(epoch_s: float | None) -> str | None:
    """The UTC day (``YYYY-MM-DD``) of a Unix time, None when there is none or it is not a plausible one."""
    import datetime as dt

    if epoch_s is None or not math.isfinite(epoch_s) or not 1e9 <= epoch_s <= 1e10:
        return None
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC).date().isoformat()
