"""Pools of serving instances: engine configuration, prices and the
batch-time profile of each instance. ``qwen3-h100`` reproduces the paper's
setup (the paper's setup, docs/results/paper.md); other pools are JSON files of the same shape::

    {"name": "...", "frontend_overhead_s": 0.005,
     "instances": [{"instance_id", "model", "profile", ...}, ...]}

where an instance takes any field of ``estimators.engine.config.InstanceConfig``
(``policy``, ``max_num_batched_tokens``, ``max_num_seqs``, ``block_size``,
``num_kv_blocks``, ``watermark``, ``max_model_len``, prices, ...); absent
fields take its defaults.

**Replicas.** An entry may also say ``"replicas": N`` (a whole number in
[1, 4096]): N identical instances of that entry, one after another in the
pool's order, with ids ``<instance_id>-r0`` .. ``<instance_id>-r{N-1}``
(``replicas: 1`` or no key keeps the id as written). Production pools serve
each model from several replicas behind one gateway; routers see a replica
as one more instance of the same ``model`` (``routers.fleet`` groups them).
The built-in ``qwen3-h100-x8``, ``-x32`` and ``-x128`` are ``qwen3-h100``
with 8, 32 and 128 replicas of each model (24, 96 and 384 instances).

**Profiles.** An entry naming a request-level profile (``calibrate
--from-requests``) takes the profile's fitted engine settings (its
``fitted_on.engine``) for every key it does not state, and the pool takes
the profile's fitted front-end overhead unless the file states
``frontend_overhead_s``: a pool naming a calibrated profile replays the
engine that was calibrated, not ``InstanceConfig``'s defaults. A profile
whose fit includes the API server's serial queue is refused where the twin
does not model that queue unless the entry says ``"frontend": "overhead"``
(``load_pool``).

Limits (refused at load with the file, entry row and key): engine counts
whole numbers in [1, 2^31 - 1]; prices USD per million tokens in [0, 1e6];
``host_speed`` in (0, 1000]; ``chunked_prefill`` and ``prefix_caching``
JSON booleans; ``url`` (the server the instance runs on, for ``latroute
route``) an http(s) URL, on entries without replicas, and ``state_url``
(where that server publishes its scheduler state for ``route --view
exact``, when not on ``url`` itself: the recording scheduler's
``LATROUTE_STATE_LISTEN`` port) the same; what vLLM itself refuses (``InstanceConfig.to_array``); the
file read through ``traces.files.paths`` (no FIFOs or devices, UTF-8).
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from estimators.engine.config import InstanceConfig
from estimators.timemodel.profile import read_json_input
from traces.datamodel.limits import shown
from traces.errors import BadInput


@dataclass(frozen=True)
class Pool:
    name: str
    instances: tuple[InstanceConfig, ...]
    frontend_overhead_s: float = 0.0  # API/front-end time added to every TTFT
    notes: dict = field(default_factory=dict)
    urls: tuple[str | None, ...] = ()  # per instance, the server it runs on (``latroute route``); () when none says
    state_urls: tuple[str | None, ...] = ()  # per instance, its state feed when not at its url; () when none says
    # per instance, where each engine setting that is not InstanceConfig's default came from: "pool entry" or
    # "profile P's fit"; () for the built-in pools
    sources: tuple[dict[str, str], ...] = field(default=(), compare=False)  # provenance, not the pool's content
    # per instance, the serial front end its profile's fit assumed (``fitted_on.request_fit.frontend``, None:
    # none, or the entry keeps only the overhead); () when no entry's profile has one
    frontends: tuple[dict | None, ...] = ()

    def to_json(self) -> dict:
        return {"name": self.name, "frontend_overhead_s": self.frontend_overhead_s,
                "instances": [asdict(i) for i in self.instances], "notes": self.notes}


_URL = re.compile(r"https?://[^\s/?#]+(/[^\s?#]*)?")


def _port_ok(url: str) -> bool:
    """The URL's port, when it names one, in 1-65535 (urllib refuses above; 0 is no server's)."""
    from urllib.parse import urlparse

    try:
        port = urlparse(url).port
    except ValueError:
        return False
    return port is None or 1 <= port <= 65535
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
        notes={"source": "the paper's setup (arXiv 2607.18253; docs/results/paper.md)", "kv": "bf16, 90% of memory after weights, block size 16",
               "prefix_caching": False},
    )


def _qwen3_h100_pc() -> Pool:
    """qwen3-h100 with prefix caching on, as ``vllm serve`` runs by default:
    for workloads that share prefixes (sessions, system prompts, hash_ids)."""
    base = _qwen3_h100()
    return replace(base, name="qwen3-h100-pc",
                   instances=tuple(replace(c, prefix_caching=True) for c in base.instances),
                   notes={**base.notes, "prefix_caching": True})


MAX_REPLICAS = 4096


def replica_id(instance_id: str, k: int, n: int) -> str:
    """The id of replica ``k`` of ``n`` (the id as written when ``n`` is 1)."""
    return instance_id if n == 1 else f"{instance_id}-r{k}"


def with_replicas(pool: Pool, n: int, name: str) -> Pool:
    """``pool`` with each instance repeated ``n`` times (``replica_id``)."""
    return replace(pool, name=name,
                   instances=tuple(replace(c, instance_id=replica_id(c.instance_id, k, n))
                                   for c in pool.instances for k in range(n)),
                   notes={**pool.notes, "replicas": n})


def _qwen3_h100_x(n: int):
    def make() -> Pool:
        return with_replicas(_qwen3_h100(), n, f"qwen3-h100-x{n}")
    make.__doc__ = f"qwen3-h100 with {n} replicas of each model ({3 * n} instances)."
    return make


BUILTIN_POOLS = {"qwen3-h100": _qwen3_h100, "qwen3-h100-pc": _qwen3_h100_pc,
                 "qwen3-h100-x8": _qwen3_h100_x(8), "qwen3-h100-x32": _qwen3_h100_x(32),
                 "qwen3-h100-x128": _qwen3_h100_x(128)}


def _named_key(message: str, entry: dict) -> str:
    """The key of a pool entry an ``InstanceConfig`` refusal names (its
    messages start with the field's name), else ``instances``."""
    first = message.split(" ", 1)[0]
    return f"instances.{first}" if first in entry else "instances"


FRONTEND_MODES = ("profile", "overhead")
_NOT_ENGINE = {"instance_id", "model", "profile", "price_in", "price_out", "device"}


@dataclass(frozen=True)
class _Fitted:
    """What a request-level profile's fit says about the engine behind it."""

    name: str
    engine: dict  # InstanceConfig fields
    overhead_s: float | None
    frontend: dict | None  # the serial front end, when it costs anything

    @property
    def serial(self) -> str | None:
        fe = self.frontend or {}
        per_req, per_out = float(fe.get("per_request_s", 0.0)), float(fe.get("per_output_s", 0.0))
        if per_req <= 0 and per_out <= 0:
            return None
        return f"{1e3 * per_req:.2f} ms per request, {1e3 * per_out:.3f} ms per delivered token"


def _fitted(ref: str, known: set[str]) -> _Fitted | None:
    """The fit of the profile an entry names, when it is a request-level
    fit (``calibrate --from-requests`` writes ``fitted_on.engine`` and
    ``fitted_on.request_fit``); None for other profiles and for a name that
    is neither a built-in nor an existing file (the twin refuses it when it
    loads the instance's profile)."""
    from estimators.timemodel.builtin_profiles import BUILTIN_PROFILES
    from estimators.timemodel.profile import load_profile

    if not isinstance(ref, str) or (ref not in BUILTIN_PROFILES and not os.path.lexists(ref)):
        return None
    prof = load_profile(ref)
    engine = {k: v for k, v in (prof.fitted_on.get("engine") or {}).items() if k in known and k not in _NOT_ENGINE}
    fit = prof.fitted_on.get("request_fit") or {}
    if not engine and not fit:
        return None
    overhead = fit.get("frontend_overhead_s")
    return _Fitted(prof.name, engine, None if overhead is None else float(overhead), fit.get("frontend") or None)


def load_pool(name_or_path: str | Path, serial_frontend: bool = False, profiles: bool = True) -> Pool:
    """A built-in pool or a pool file (see the module's docstring).

    **An entry naming a request-level profile** (``calibrate
    --from-requests``) takes that profile's fitted engine settings for every
    key the entry does not state, and the pool takes the profile's fitted
    front-end overhead when the file states no ``frontend_overhead_s`` (the
    entries' profiles must then agree on it). A profile whose fit queues the
    API server's work (``harness.requestlevel.frontend``) is refused unless
    the caller models that queue (``serial_frontend``: the request-level
    commands) or the entry says ``"frontend": "overhead"`` (keep only the
    fitted constant overhead). ``profiles=False`` reads the entries as
    written (``calibrate --from-requests --pool``: the profile is the one
    being fitted)."""
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
    rows = []  # the entry row of each instance (replicas share their entry's)
    urls: list[str | None] = []
    state_urls: list[str | None] = []
    sources: list[dict[str, str]] = []
    frontends: list[dict | None] = []
    overheads: dict[str, float] = {}  # profile -> its fitted overhead
    fits: dict = {}  # profile reference -> its request-level fit (None: not one)
    for i, inst in enumerate(doc["instances"], start=1):
        if not isinstance(inst, dict):
            raise BadInput(path, i, "instances", "not an object")
        for key_ in ("instance_id", "model", "profile"):
            if key_ not in inst:
                raise BadInput(path, i, key_, "missing key")
        inst = dict(inst)
        n_rep = inst.pop("replicas", 1)
        if isinstance(n_rep, bool) or not isinstance(n_rep, int) or not 1 <= n_rep <= MAX_REPLICAS:
            raise BadInput(path, i, "instances.replicas", f"must be a whole number in [1, {MAX_REPLICAS}], "
                                                          f"got {shown(n_rep)}")
        url, state_url = inst.pop("url", None), inst.pop("state_url", None)
        for key_, u in (("url", url), ("state_url", state_url)):
            if u is None:
                continue
            if not isinstance(u, str) or not _URL.fullmatch(u):
                raise BadInput(path, i, f"instances.{key_}", f"must be an http(s) URL, got {shown(u)}")
            if not _port_ok(u):
                raise BadInput(path, i, f"instances.{key_}", f"{shown(u)}: the port must be in 1-65535")
            if n_rep != 1:
                raise BadInput(path, i, f"instances.{key_}", "an entry with replicas names no single server: "
                                                             "give each replica its own entry and url")
        mode = inst.pop("frontend", "profile")
        if mode not in FRONTEND_MODES:
            raise BadInput(path, i, "instances.frontend", f"must be one of {', '.join(FRONTEND_MODES)}, got "
                                                          f"{shown(mode)}")
        unknown = set(inst) - known
        if unknown:
            raise BadInput(path, i, sorted(unknown)[0], "unknown key")
        if profiles and inst["profile"] not in fits:  # read once per profile (a pool names one for many entries)
            fits[inst["profile"]] = _fitted(inst["profile"], known)
        fitted = fits.get(inst["profile"]) if profiles else None
        source = {k: "pool entry" for k in inst if k not in _NOT_ENGINE}
        frontend = None
        if fitted is not None:
            source.update({k: f"profile {fitted.name}'s fit" for k in fitted.engine if k not in inst})
            inst = {**fitted.engine, **inst}
            if fitted.overhead_s is not None:
                overheads[fitted.name] = fitted.overhead_s
            if fitted.serial is not None and mode == "profile":
                if not serial_frontend:
                    raise BadInput(path, i, "instances.profile",
                                   f"{inst['profile']}: its fit queues the API server's work ({fitted.serial}), which "
                                   "this command's twin does not model; say \"frontend\": \"overhead\" in the entry "
                                   "to keep only its fitted constant overhead")
                frontend = fitted.frontend
        try:
            cfg = InstanceConfig(**inst)
            cfg.to_array()  # what vLLM refuses (chunked prefill off with a budget under max_model_len, ...)
        except (TypeError, ValueError, OverflowError) as e:
            raise BadInput(path, i, _named_key(str(e), inst), str(e)) from None
        for k in range(n_rep):
            instances.append(cfg if n_rep == 1 else replace(cfg, instance_id=replica_id(cfg.instance_id, k, n_rep)))
            rows.append(i)
            urls.append(url.rstrip("/") if url else None)
            state_urls.append(state_url.rstrip("/") if state_url else None)
            sources.append(source)
            frontends.append(frontend)
    seen: set[str] = set()
    for row, c in zip(rows, instances, strict=True):
        if c.instance_id in seen:
            raise BadInput(path, row, "instance_id", f"duplicate instance id {c.instance_id!r}")
        seen.add(c.instance_id)
    from harness.twin.pools.memory import memory_shortfall

    short = memory_shortfall(instances)  # before any instance allocates (4,096 replicas once ran out mid-set-up)
    if short is not None:
        raise BadInput(path, None, "instances", short)
    notes = doc.get("notes") or {}
    if not isinstance(notes, dict):
        raise BadInput(path, None, "notes", "must be an object")
    if "frontend_overhead_s" in doc or not overheads:
        overhead = doc.get("frontend_overhead_s", 0.0)
    elif len(set(overheads.values())) == 1:
        overhead = next(iter(overheads.values()))
        notes = {**notes, "frontend_overhead_s": f"profile {', '.join(overheads)}'s fit"}
    else:
        raise BadInput(path, None, "frontend_overhead_s", "not stated, and the entries' profiles fit different "
                       "front-end overheads (" + ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in overheads.items())
                       + "): the twin adds one per pool; state it")
    if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not 0 <= overhead <= 3600:
        raise BadInput(path, None, "frontend_overhead_s", f"must be seconds in [0, 3600], got {shown(overhead)}")
    name = doc.get("name", path.stem)
    if not isinstance(name, str):
        raise BadInput(path, None, "name", f"must be a string, got {shown(name)}")
    return Pool(name=name, instances=tuple(instances), frontend_overhead_s=float(overhead), notes=notes,
                urls=tuple(urls) if any(urls) else (), state_urls=tuple(state_urls) if any(state_urls) else (),
                sources=tuple(sources), frontends=tuple(frontends) if any(frontends) else ())
