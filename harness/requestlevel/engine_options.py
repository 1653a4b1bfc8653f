"""The engine behind a request-level trace: every setting marked.

A per-request trace (vLLM's per-request stats, ``vllm bench serve``
results, LMBench CSVs, a production log) records arrivals, lengths and
measured TTFTs but neither the engine's steps nor, mostly, its
configuration. To replay it on the twin we need an ``InstanceConfig``; each
of its settings comes from, in increasing priority,

1. ``REQUEST_TRACE_DEFAULTS`` below: only for a trace imported before its
   settings were marked (``REQUEST_TRACE_DEFAULT_SOURCES`` says why each);
2. the settings the trace's import *defaulted* (``meta.json`` ``engine``
   with ``marks``: vLLM's documented default for the trace's version and
   GPU, ``traces.vllm_releases.defaults``; or the assumption taken where vLLM has
   none, as for the KV cache size);
3. the ``engine`` section that ``calibrate --from-requests`` writes into
   a profile's ``fitted_on`` (so ``validate --profile P`` needs nothing else);
4. what the trace *gives* or *infers* (its own configuration, or what the
   import derived from the run, saying how);
5. ``--engine KEY=VALUE`` options (any ``InstanceConfig`` field).

``vllm_version`` (whose scheduling rules the kernel follows) travels like
the rest: given when the trace's source stated it, defaulted to the newest
checked release otherwise. A version outside the checked window reaches
the replay only when its import accepted it as unmodelled, as the nearest
checked release (said in its mark); ``--engine vllm_version=V`` takes a
version inside the window only.

``request_engine_marked`` returns the configuration with each setting's
mark (given / inferred / defaulted) and where it came from, so a command
can print them (``engine_lines``); ``trace_caveats`` is what results made
from the traces must carry (unmodelled settings accepted at import, runs
that logged fewer requests than they sent). Unknown settings (the budget,
``max_num_seqs``) can be searched by ``calibrate --from-requests
--search-engine``. The front end in front of the engine
(``harness.requestlevel.frontend``: a constant overhead, fitted, and one
serial queue of admissions and output deliveries at measured costs per
request and per delivered token) travels in the profile too.

Why ``REQUEST_TRACE_DEFAULTS`` holds what it holds (the A100
``benchmark_serving`` runs of April 2025, imported before settings were
marked, name no vLLM version; their ``.commands`` files start ``vllm
serve`` with no scheduler flags, and the image of mid-April 2025 is vLLM
0.8.x):

- ``policy vllm-v1``: 0.8.0 (March 2025) made the V1 engine the default
  for supported models; Llama-3 and DeepSeek-V2 both were.
- ``max_num_batched_tokens 2048`` and ``max_num_seqs 256``: vLLM's
  defaults for ``vllm serve`` on a GPU under 70 GiB (an A100-40GB),
  chunked prefill always on in V1 (``docs/reference/engine-defaults.md``).
- Prefix caching off in the twin: the benchmark re-sends the same 200
  prompts at every rate on the same server, so every run after the first
  finds its prompts cached; a request-level trace names no prompt blocks,
  so that cache is modelled by hits given outright (``--prefix-cache
  warm``, ``calibrate --warm TRACE``), not by the block cache.
- ``block_size 16``: vLLM's CUDA default.
- ``num_kv_blocks 26000``: Llama-3.3-70B in bf16 on 8 x A100-40GB with
  ``gpu_memory_utilization`` 0.9 keeps about 288 GB, of which ~140 GB are
  weights and a few GB activations and CUDA graphs, leaving ~135 GB for
  KV; one token costs 80 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes =
  320 KiB, so ~420k tokens = ~26k blocks of 16.
- ``max_model_len 131072``: Llama-3.x's context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from estimators.engine.config import InstanceConfig
from estimators.engine.releases import KERNEL_VERSION, in_window, nearest_in_window, version_key, window_text
from estimators.timemodel.profile import BatchTimeProfile
from harness.requestlevel.frontend import FrontEnd
from traces.errors import BadOption

# prefix_caching off in the twin: a request-level trace names no prompt blocks, so the cache vLLM had is
# modelled by hits given outright (``--prefix-cache warm``), not by the block cache
REQUEST_TRACE_DEFAULTS = InstanceConfig(
    instance_id="i0", model="", gpus=8, policy="vllm-v1", max_num_batched_tokens=2048, max_num_seqs=256,
    block_size=16, num_kv_blocks=26_000, max_model_len=131_072, prefix_caching=False)

_FALLBACK = "latroute's fallback for a trace whose import marked no settings"
REQUEST_TRACE_DEFAULT_SOURCES = {
    "gpus": f"{_FALLBACK}: 8, the A100 runs' tensor x pipeline parallel size",
    "policy": f"{_FALLBACK}: vLLM V1's scheduler, the default since vLLM 0.8.0",
    "max_num_batched_tokens": f"{_FALLBACK}: vLLM's vllm serve default on a GPU under 70 GiB (A100-40GB)",
    "max_num_seqs": f"{_FALLBACK}: vLLM's vllm serve default on a GPU under 70 GiB (A100-40GB)",
    "block_size": f"{_FALLBACK}: vLLM's CUDA default",
    "num_kv_blocks": f"{_FALLBACK}: Llama-3.3-70B bf16 on 8 x A100-40GB at gpu_memory_utilization 0.9",
    "max_model_len": f"{_FALLBACK}: Llama-3.x's context",
    "prefix_caching": f"{_FALLBACK}: off in the twin (request logs name no prompt blocks; --prefix-cache warm)",
    "chunked_prefill": f"{_FALLBACK}: always on in vLLM V1",
    "long_prefill_token_threshold": f"{_FALLBACK}: vLLM's default (off)",
    "async_scheduling": f"{_FALLBACK}: off (vLLM 0.8's V1 had no async scheduler)",
    "vllm_version": f"{_FALLBACK}: the trace names no vLLM version: {KERNEL_VERSION}'s scheduling rules, the "
                    "newest release latroute checked",
}
GIVEN, INFERRED, DEFAULTED = "given", "inferred", "defaulted"  # as traces.importers.engine_settings marks them


@dataclass(frozen=True)
class Mark:
    """How one replayed setting is known: given, inferred or defaulted, and from where."""

    mark: str
    how: str


class StatedEngine(dict):
    """What traces state of their engine (``trace_engine``): the given and inferred settings as a dict (they
    override a profile's fitted engine), ``marks`` saying how each is known, and ``defaults``, the settings
    the imports defaulted, each (value, Mark) (they go under a profile's fitted engine)."""

    def __init__(self, stated: dict, marks: dict[str, Mark], defaults: dict[str, tuple], files: dict | None = None):
        super().__init__(stated)
        self.marks = marks
        self.defaults = defaults
        self.files = files or {}  # setting -> the meta.json stating it: a refusal of the setting names that file

    def refusal(self, keys, options: dict, why: str) -> BadOption | None:
        """The refusal of a setting among ``keys`` that a trace's meta.json states (and no ``--engine`` gave),
        naming that file and key; None when ``--engine`` gave one of them or no trace states any."""
        from traces.errors import BadInput

        if any(k in options for k in keys):
            return None
        k = next((k for k in keys if k in self.files), None)
        return None if k is None else BadInput(self.files[k], None, f"engine.settings.{k}", why)


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
                if key == "vllm_version" and not in_window(raw):
                    raise BadOption("--engine", f"vllm_version: {raw!r} is outside the vLLM releases whose "
                                                f"scheduling rules latroute checked ({window_text()})")
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


def trace_engine(traces: list) -> StatedEngine:
    """The engine settings the traces state (``meta.json`` ``engine``, written by ``trace import`` of a
    request-level format), as ``InstanceConfig`` fields: settings the kernel has no field for are left out
    (``async_scheduling`` is one it has: a GPU run replays with vLLM's async rules unless ``--engine
    async_scheduling=false``). Given and inferred settings must agree across the traces (refused
    otherwise: calibrate the runs of one engine together, or give ``--engine``); a defaulted setting that
    differs takes the largest value (a default the import derived from each run's own requests, such as a
    KV size large enough never to bind, differs by run). A trace imported before settings were marked has
    ``settings`` only: they are taken as given."""
    from traces.errors import BadInput

    out: dict = {}
    marks: dict[str, Mark] = {}
    defaults: dict[str, tuple] = {}
    first: dict = {}
    for t in traces:
        engine = t.meta.get("engine") or {}
        settings, kinds, sources = engine.get("settings") or {}, engine.get("marks") or {}, engine.get("sources") or {}
        for k, v in settings.items():
            if k not in _FIELDS or k in _SKIP:
                continue
            kind = kinds.get(k, GIVEN)
            how = f"{t.path.name}: {sources.get(k, 'meta.json engine.settings')}"
            if k == "vllm_version" and (kind == INFERRED or not (isinstance(v, str) and in_window(v))):
                v, kind, how = _replayed_version(t, v, kind, how)
            if kind == DEFAULTED:
                if k not in defaults or _larger(v, defaults[k][0]):
                    defaults[k] = (v, Mark(DEFAULTED, how))
                continue
            if k in out and out[k] != v:
                raise BadInput(t.path / "meta.json", None, f"engine.settings.{k}",
                               f"{v} but {first[k]} states {out[k]}: calibrate one engine's traces together "
                               f"(or give --engine {k}=N)")
            out.setdefault(k, v)
            marks.setdefault(k, Mark(kind, how))
            first.setdefault(k, t.path)
    return StatedEngine(out, marks, {k: d for k, d in defaults.items() if k not in out},
                        {k: p / "meta.json" for k, p in first.items()})


def _replayed_version(t, version, kind: str, how: str) -> tuple[str, str, str]:
    """The rules a trace's vLLM version outside the checked window is replayed with: the nearest checked
    release (the newest for no version at all) when its import accepted it as unmodelled; the newest checked
    release, defaulted, when an older import inferred it from the run's date or defaulted it (the source
    stated none, as a re-import now says); refused when stated and not accepted."""
    from traces.errors import BadInput

    engine = t.meta.get("engine") or {}
    if kind == GIVEN and "vllm_version" not in (engine.get("accepted_unmodelled") or []):
        raise BadInput(t.path / "meta.json", None, "engine.settings.vllm_version",
                       f"{version}: outside the vLLM releases whose scheduling rules latroute checked "
                       f"({window_text()}); import the run again with --accept-unmodelled vllm_version")
    if kind == GIVEN:
        rules = nearest_in_window(version) if isinstance(version, str) and version_key(version) else KERNEL_VERSION
        return rules, kind, (f"{how}; outside the checked window ({window_text()}), accepted at import as "
                             f"unmodelled: replayed with {rules}'s rules, the nearest checked release")
    return KERNEL_VERSION, DEFAULTED, (f"{how}; the source states no version ({version} was {kind} before "
                                       f"latroute followed a release's rules): {KERNEL_VERSION}'s scheduling rules, "
                                       "the newest release latroute checked")


def _larger(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) and not bool(b)
    return isinstance(a, (int, float)) and isinstance(b, (int, float)) and a > b


def request_engine_marked(profile: BatchTimeProfile | None, options: dict | None = None,
                          base: InstanceConfig = REQUEST_TRACE_DEFAULTS,
                          stated: dict | None = None) -> tuple[InstanceConfig, dict[str, Mark]]:
    """The replayed engine and how each of its settings is known: ``base`` (``REQUEST_TRACE_DEFAULTS``), the
    traces' defaulted settings, the profile's fitted engine, the traces' given and inferred settings
    (``trace_engine``), then explicit options."""
    kw: dict = {}
    marks: dict[str, Mark] = ({k: Mark(DEFAULTED, why) for k, why in REQUEST_TRACE_DEFAULT_SOURCES.items()}
                              if base is REQUEST_TRACE_DEFAULTS else {})
    stated_marks = stated.marks if isinstance(stated, StatedEngine) else {}
    if isinstance(stated, StatedEngine):
        for k, (v, m) in stated.defaults.items():
            kw[k], marks[k] = v, m
    if profile is not None:
        searched = bool((profile.fitted_on.get("request_fit") or {}).get("engine_searched"))
        how = f"profile {profile.name}'s fitted engine" + (" (searched in calibration)" if searched else "")
        for k, v in (profile.fitted_on.get("engine") or {}).items():
            if k in _FIELDS and k not in _SKIP:
                kw[k], marks[k] = v, Mark(INFERRED, how)
    for k, v in (stated or {}).items():
        kw[k], marks[k] = v, stated_marks.get(k, Mark(GIVEN, "the trace's meta.json engine.settings"))
    for k, v in (options or {}).items():
        kw[k], marks[k] = v, Mark(GIVEN, "--engine")
    try:
        cfg = replace(base, **kw)
        cfg.to_array()  # what vLLM refuses (a budget below max_num_seqs, ...): at the entry, not at the replay
        return cfg, marks
    except (TypeError, ValueError) as e:
        bad = [k for k in kw if k in str(e)] or list(kw)
        blame = stated.refusal(bad, options or {}, str(e)) if isinstance(stated, StatedEngine) else None
        raise (blame or BadOption("--engine", str(e))) from None


def request_engine(profile: BatchTimeProfile | None, options: dict | None = None,
                   base: InstanceConfig = REQUEST_TRACE_DEFAULTS, stated: dict | None = None) -> InstanceConfig:
    """``request_engine_marked`` without the marks."""
    return request_engine_marked(profile, options, base, stated)[0]


def engine_lines(engine: InstanceConfig, marks: dict[str, Mark]) -> list[str]:
    """One line per replayed setting: its value, mark and source (what a request-level command prints)."""
    return [f"engine {k} = {_fmt(getattr(engine, k))}  [{m.mark}] {m.how}" for k, m in sorted(marks.items())
            if hasattr(engine, k)]


def marks_json(engine: InstanceConfig, marks: dict[str, Mark]) -> dict:
    """The marks as a result's metrics.json stores them: setting -> value, mark and source."""
    return {k: {"value": getattr(engine, k), "mark": m.mark, "how": m.how} for k, m in sorted(marks.items())
            if hasattr(engine, k)}


def marks_summary(marks: dict[str, dict], caveats: dict) -> list[str]:
    """What a request-level command prints of the replayed engine (``marks_json``): the count of each mark,
    the defaulted settings by name (the source of each is in metrics.json), and the trace's caveats."""
    count = {k: sum(m["mark"] == k for m in marks.values()) for k in (GIVEN, INFERRED, DEFAULTED)}
    defaulted = sorted(k for k, m in marks.items() if m["mark"] == DEFAULTED)
    lines = [f"engine settings: {count[GIVEN]} given, {count[INFERRED]} inferred, {count[DEFAULTED]} defaulted"
             + (f" ({', '.join(defaulted)})" if defaulted else "") + "; each with its source in metrics.json "
             "engine_marks"]
    if caveats.get("accepted_unmodelled"):
        lines.append("NOT MODELLED, accepted at import: " + ", ".join(caveats["accepted_unmodelled"]))
    for c in caveats.get("incomplete") or []:
        lines.append(f"INCOMPLETE run: {c['trace']} logged {c['logged']} of {c['sent']} requests sent "
                     "(imported with --allow-incomplete; the missing ones are not a random sample)")
    return lines


def _fmt(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def trace_caveats(traces: list) -> dict:
    """What every result made from these traces must carry: the unmodelled settings their imports accepted
    (``meta.json`` ``engine.accepted_unmodelled`` and ``engine.not_modelled``) and the runs that logged fewer
    requests than they sent (``completeness``, imported with ``--allow-incomplete``)."""
    out: dict = {"accepted_unmodelled": [], "not_modelled": [], "incomplete": []}
    for t in traces:
        engine = t.meta.get("engine") or {}
        for k in engine.get("accepted_unmodelled") or []:
            if k not in out["accepted_unmodelled"]:
                out["accepted_unmodelled"].append(k)
        out["not_modelled"] += [f"{t.path.name}: {w}" for w in engine.get("not_modelled") or []]
        done = t.meta.get("completeness") or {}
        if done.get("status") == "incomplete":
            out["incomplete"].append({"trace": str(t.path), "sent": done.get("sent"), "logged": done.get("logged"),
                                      "missing": done.get("missing")})
    return out


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
                      profile_file: str | None = None, profile: BatchTimeProfile | None = None,
                      stated: StatedEngine | None = None) -> None:
    """Refuse an engine that could not have served the measured requests.

    A request-level trace holds requests the real server served (they have
    a measured TTFT), so an engine whose ``max_model_len`` refuses some of
    them at the front end (prompt >= max_model_len), or whose KV cache
    cannot hold one of them whole (it would be preempted forever), is not
    the engine of the trace: fitting or scoring against it would replay
    nothing (``calibrate --from-requests --engine max_model_len=5`` once
    ran for minutes and wrote a profile). Named: the ``--engine`` setting
    when the user gave it, else the trace's meta.json stating it (``stated``),
    else the profile file whose fitted engine it is.
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
        blame = stated.refusal([key, "block_size"] if key == "num_kv_blocks" else [key], options, why) \
            if stated is not None else None
        if blame is not None:
            raise blame
        fitted = key in ((profile.fitted_on.get("engine") or {}) if profile is not None else {})
        if key in options or ("block_size" in options and key == "num_kv_blocks") or profile_file is None \
                or not fitted:
            raise BadOption("--engine", why + ("" if key in options else f"; give --engine {key}=N"))
        raise BadInput(profile_file, None, f"fitted_on.engine.{key}", why)
