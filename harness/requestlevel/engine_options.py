"""The engine behind a request-level trace: what the trace does not say.

A per-request trace (vLLM ``benchmark_serving`` results, LMBench CSVs, a
production log) records arrivals, lengths and measured TTFTs but neither
the engine's steps nor its configuration. To replay it on the twin we need
an ``InstanceConfig``; it comes, in increasing priority, from

1. ``REQUEST_TRACE_DEFAULTS`` below,
2. the ``engine`` section that ``calibrate --from-requests`` writes into
   a profile's ``fitted_on`` (so ``validate --profile P`` needs nothing else),
3. what the trace itself states (``meta.json`` ``engine.settings``, from
   ``trace import vllm-reqstats``: the run's own engine configuration),
4. ``--engine KEY=VALUE`` options (any ``InstanceConfig`` field).

Defaults and why (the A100 ``benchmark_serving`` runs of April 2025 name
no vLLM version; the ``.commands`` files start ``vllm serve`` with no
scheduler flags, and the image of mid-April 2025 is vLLM 0.8.x):

- ``policy vllm-v1``: 0.8.0 (March 2025) made the V1 engine the default
  for supported models; Llama-3 and DeepSeek-V2 both were.
- ``max_num_batched_tokens 2048`` and ``max_num_seqs 256``: V1's defaults
  for the OpenAI server in 0.8 on a GPU that is not an H100/H200
  (``EngineArgs._set_default_args_v1``: 8192 for ``vllm serve`` on
  H100/H200, 2048 elsewhere; 16384 / 8192 for the ``LLM`` class), chunked
  prefill always on in V1.
- Prefix caching: V1 turns it on by default. The benchmark re-sends the
  same 200 prompts at every rate on the same server, in the order 1, 4, 16
  q/s, all at once, so every run after the first finds its prompts cached
  (the all-at-once run prefills 42.7k prompt tokens of a 70B model in
  0.45 s, 13 PFLOP/s, five times what 8 A100s can compute: only the
  cached prompts explain it). Request-level commands take
  ``--prefix-cache warm`` (``calibrate --warm TRACE``) for such runs.
- ``block_size 16``: vLLM's CUDA default.
- ``num_kv_blocks 26000``: Llama-3.3-70B in bf16 on 8 x A100-40GB with
  ``gpu_memory_utilization`` 0.9 keeps about 288 GB, of which ~140 GB are
  weights and a few GB activations and CUDA graphs, leaving ~135 GB for
  KV; one token costs 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes =
  320 KiB, so ~420k tokens = ~26k blocks of 16. The 200-request runs hold
  at most ~100k tokens, so the exact figure does not bind here; other
  deployments should say theirs.
- ``max_model_len 131072``: Llama-3.x's context (the front end refuses
  longer prompts; none of these traces come close).

Unknown settings (the budget, ``max_num_seqs``) can be searched by
``calibrate --from-requests --search-engine``. The front end in front of
the engine (``harness.requestlevel.frontend``: a constant overhead, fitted, and one
serial queue of admissions and output deliveries at measured costs per
request and per delivered token) travels in the profile too.
"""
from __future__ import annotations

import math
from dataclasses import fields, replace

from estimators.engine.config import InstanceConfig
from estimators.profile import BatchTimeProfile
from harness.requestlevel.frontend import FrontEnd
from traces.errors import BadOption

# prefix_caching off in the twin: a request-level trace names no prompt blocks, so the cache vLLM had is
# modelled by hits given outright (``--prefix-cache warm``), not by the block cache
REQUEST_TRACE_DEFAULTS = InstanceConfig(
    instance_id="i0", model="", gpus=8, policy="vllm-v1", max_num_batched_tokens=2048, max_num_seqs=256,
    block_size=16, num_kv_blocks=26_000, max_model_len=131_072, prefix_caching=False)

_MAX_SETTING = 2**31 - 1
_FIELDS = {f.name: f for f in fields(InstanceConfig)}
_SKIP = {"instance_id", "model", "profile", "price_in", "price_out", "device"}


def engine_settings(config: InstanceConfig) -> dict:
    """The engine part of a configuration, as a profile's ``fitted_on.engine`` stores it."""
    return {k: v for k, v in config.to_row().items() if k not in _SKIP and v is not None and v == v}


def parse_engine_options(items: tuple[str, ...] | list[str]) -> dict:
    """``KEY=VALUE`` strings into typed ``InstanceConfig`` fields (BadOption on a bad one)."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in _FIELDS or key in _SKIP:
            allowed = ", ".join(k for k in _FIELDS if k not in _SKIP)
            raise BadOption("--engine", f"{item!r} is not KEY=VALUE with KEY one of {allowed}")
        kind = _FIELDS[key].type if isinstance(_FIELDS[key].type, str) else _FIELDS[key].type.__name__
        try:
            if kind.startswith("int"):
                out[key] = int(raw)
                if not 0 <= out[key] <= _MAX_SETTING:  # the kernels hold settings in int64 sums: refuse, never wrap
                    raise BadOption("--engine", f"{key}: must be an integer in [0, {_MAX_SETTING}] (got {raw!r})")
            elif kind.startswith("float"):
                out[key] = float(raw)
                if not math.isfinite(out[key]):
                    raise BadOption("--engine", f"{key}: must be a finite number (got {raw!r})")
            elif kind.startswith("bool"):
                if raw.lower() not in ("1", "0", "true", "false", "on", "off"):
                    raise ValueError(raw)
                out[key] = raw.lower() in ("1", "true", "on")
            else:
                out[key] = raw
        except ValueError:
            raise BadOption("--engine", f"{key}: {raw!r} is not a valid {kind.split(' ')[0]}") from None
    return out


def parse_search_options(items: tuple[str, ...] | list[str]) -> dict:
    """``KEY=v1,v2,...`` strings into an engine-setting grid for calibration."""
    grid: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        values = [parse_engine_options([f"{key}={v}"]) for v in raw.split(",") if v.strip()]
        if not sep or not values:
            raise BadOption("--search", f"{item!r} is not KEY=V1,V2,...")
        k = next(iter(values[0]))
        grid[k] = tuple(v[k] for v in values)
    return grid


def trace_engine(traces: list) -> dict:
    """The engine settings the traces themselves state (``meta.json`` ``engine.settings``, written by
    ``trace import vllm-reqstats``), as ``InstanceConfig`` fields: settings the kernel has no field for
    are left out (``async_scheduling`` is one it has: a GPU run replays with vLLM's async rules unless
    ``--engine async_scheduling=false``). Traces that state different values
    for one setting are refused (calibrate the runs of one engine together, or give ``--engine``)."""
    from traces.errors import BadInput

    out: dict = {}
    first: dict = {}
    for t in traces:
        settings = ((t.meta.get("engine") or {}).get("settings") or {})
        for k, v in settings.items():
            if k not in _FIELDS or k in _SKIP:
                continue
            if k in out and out[k] != v:
                raise BadInput(t.path / "meta.json", None, f"engine.settings.{k}",
                               f"{v} but {first[k]} states {out[k]}: calibrate one engine's traces together "
                               f"(or give --engine {k}=N)")
            out.setdefault(k, v)
            first.setdefault(k, t.path)
    return out


def request_engine(profile: BatchTimeProfile | None, options: dict | None = None,
                   base: InstanceConfig = REQUEST_TRACE_DEFAULTS, stated: dict | None = None) -> InstanceConfig:
    """Defaults, then the profile's fitted engine, then what the trace states (``trace_engine``), then
    explicit options."""
    kw = {}
    if profile is not None:
        kw.update({k: v for k, v in (profile.fitted_on.get("engine") or {}).items() if k in _FIELDS and k not in _SKIP})
    kw.update(stated or {})
    kw.update(options or {})
    try:
        return replace(base, **kw)
    except (TypeError, ValueError) as e:
        raise BadOption("--engine", str(e)) from None


def virtual_engines(profile: BatchTimeProfile | None) -> int:
    """V0 pipeline-parallel virtual engines the calibration assumed (1 = none)."""
    if profile is None:
        return 1
    return int((profile.fitted_on.get("request_fit") or {}).get("virtual_engines", 1))


def frontend_overhead(profile: BatchTimeProfile | None) -> float:
    """Front-end time added to every TTFT (HTTP, tokenisation, detokenisation
    of the first token), fitted by ``calibrate --from-requests``."""
    if profile is None:
        return 0.0
    return float((profile.fitted_on.get("request_fit") or {}).get("frontend_overhead_s", 0.0))


def frontend_of(profile: BatchTimeProfile | None) -> FrontEnd:
    """The serial front end (``harness.requestlevel.frontend``) the calibration assumed; none without one."""
    if profile is None:
        return FrontEnd()
    return FrontEnd.from_json((profile.fitted_on.get("request_fit") or {}).get("frontend"))


def refuse_unservable(engine: InstanceConfig, prompts: list, outputs: list, options: dict,
                      profile_file: str | None = None, profile: BatchTimeProfile | None = None) -> None:
    """Refuse an engine that could not have served the measured requests.

    A request-level trace holds requests the real server served (they have
    a measured TTFT), so an engine whose ``max_model_len`` refuses some of
    them at the front end (prompt >= max_model_len), or whose KV cache
    cannot hold one of them whole (it would be preempted forever), is not
    the engine of the trace: fitting or scoring against it would replay
    nothing (``calibrate --from-requests --engine max_model_len=5`` once
    ran for minutes and wrote a profile). Named: the ``--engine`` setting
    when the user gave it, else the profile file whose fitted engine it is.
    Checked once at the entry, from the requests' lengths."""
    import numpy as np

    from traces.errors import BadInput

    p = np.concatenate([np.asarray(x, dtype=np.int64) for x in prompts]) if prompts else np.zeros(0, np.int64)
    o = np.concatenate([np.asarray(x, dtype=np.int64) for x in outputs]) if outputs else np.zeros(0, np.int64)
    if not p.size:
        return
    problems = []
    rejected = int((p >= engine.max_model_len).sum())
    if rejected:
        problems.append(("max_model_len", f"max_model_len={engine.max_model_len} rejects {rejected} of {p.size} "
                                          f"requests (prompt >= max_model_len; the longest prompt is {int(p.max())} "
                                          "tokens, and the trace's requests were served)"))
    tokens = np.minimum(p + o, engine.max_model_len)
    blocks = -(-tokens // max(engine.block_size, 1))
    too_big = int((blocks > engine.num_kv_blocks).sum())
    if too_big and not rejected:
        problems.append(("num_kv_blocks", f"num_kv_blocks={engine.num_kv_blocks} x block_size={engine.block_size} "
                                          f"cannot hold {too_big} of {p.size} requests whole (the largest needs "
                                          f"{int(blocks.max())} blocks; the trace's requests were served)"))
    for key, why in problems:
        fitted = key in ((profile.fitted_on.get("engine") or {}) if profile is not None else {})
        if key in options or ("block_size" in options and key == "num_kv_blocks") or profile_file is None \
                or not fitted:
            raise BadOption("--engine", why + ("" if key in options else f"; give --engine {key}=N"))
        raise BadInput(profile_file, None, f"fitted_on.engine.{key}", why)
