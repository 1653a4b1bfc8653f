"""Which servers the proxy routes to, and what it knows about each.

A router needs, per backend, what the twin's routers get per instance: the
engine's configuration (its scheduler's limits, KV blocks), the model
served, its prices and its batch-time profile (``InstanceSpec``). Three
ways to say it, all resolved before the proxy binds its port:

- ``--pool POOL.json`` whose entries carry a ``url`` (every entry one);
- ``--backends URL,...`` with ``--pool NAME|POOL.json`` without urls: the
  pool's k-th instance runs on the k-th URL (as ``latroute serve
  --port-base`` lays a pool out); the counts must agree;
- ``--backends URL,...`` with ``--profile P`` alone: each backend's model
  is the first of its own ``GET /v1/models``, its engine the defaults of
  ``InstanceConfig`` (``max_model_len`` from /v1/models when it says),
  prices 0 (so utility is predicted accuracy alone), profile ``P``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from estimators.engine.config import InstanceConfig
from harness.twin.instance import InstanceSpec
from harness.twin.pools.spec import Pool
from traces.datamodel.limits import MAX_TOKENS
from traces.errors import BadOption

MAX_MODELS_PAGE = 1 << 20  # bytes of a backend's /v1/models answer
_MODEL_NAME = re.compile(r"[\x21-\x7e]{1,256}")  # a served model's name: it becomes the instance id and the forwarded "model"


@dataclass(frozen=True)
class Backend:
    url: str
    spec: InstanceSpec
    state_url: str | None = None  # where its scheduler state is published, when not at ``url`` (a real vLLM's)

    @property
    def feed_url(self) -> str:
        """``--view exact``'s source: ``latroute serve`` publishes on its own port, a real vLLM
        with the recording scheduler on ``LATROUTE_STATE_LISTEN``'s (the pool's ``state_url``)."""
        return (self.state_url or self.url) + "/latroute/state"

    @property
    def instance_id(self) -> str:
        return self.spec.instance_id

    @property
    def model(self) -> str:
        return self.spec.model


def pool_backends(pool: Pool, urls: tuple[str, ...] = ()) -> list[Backend]:
    """The pool's instances on ``urls`` (or on the pool's own ``url``s)."""
    if urls:
        if pool.urls:
            raise BadOption("--backends", f"pool {pool.name} names its servers (url); give --backends or urls, "
                                          "not both")
        if len(urls) != len(pool.instances):
            raise BadOption("--backends", f"{len(urls)} URLs for pool {pool.name}'s {len(pool.instances)} "
                                          "instances (one URL per instance, in the pool's order)")
        chosen = urls
    else:
        missing = [c.instance_id for c, u in zip(pool.instances, pool.urls or (None,) * len(pool.instances))
                   if not u]
        if missing:
            raise BadOption("--pool", f"instance {missing[0]} has no url: give each entry a \"url\", or "
                                      "--backends URL,... (one per instance)")
        chosen = pool.urls
    states = pool.state_urls or (None,) * len(pool.instances)
    return [Backend(u, InstanceSpec.from_config(c), s) for u, c, s in zip(chosen, pool.instances, states)]


def listed_backends(urls: tuple[str, ...], models: list[str], max_lens: list[int | None], profile: str) -> list[
        Backend]:
    """Bare ``--backends``: each backend as its /v1/models describes it,
    profile ``profile``, prices 0. Ids are ``b<k>-<model>``."""
    out = []
    for k, (u, m, n) in enumerate(zip(urls, models, max_lens)):
        cfg = InstanceConfig(instance_id=f"b{k}-{m}", model=m, profile=profile, price_in=0.0, price_out=0.0)
        if n:
            cfg = replace(cfg, max_model_len=int(n))
        out.append(Backend(u, InstanceSpec.from_config(cfg)))
    return out


async def listed_model(session, url: str, timeout_s: float) -> tuple[str, int | None]:
    """A bare backend's first ``/v1/models`` entry: (model, max_model_len or
    None). What the backend answers is checked like any other answer of
    its (``harness.route.forward``): a bounded JSON object, a model name of
    visible ASCII, a length in [1, MAX_TOKENS]; ValueError says what is
    wrong."""
    from aiohttp import ClientError, ClientTimeout

    from harness.route.forward import BackendFailed, bounded_read
    from harness.serve.protocol import loads_bounded

    try:
        async with session.get(url + "/v1/models", timeout=ClientTimeout(total=timeout_s)) as r:
            doc = loads_bounded(await bounded_read(r, MAX_MODELS_PAGE), 8)
    except (ClientError, TimeoutError, BackendFailed) as e:
        raise ValueError(f"{type(e).__name__}: {e}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    if not isinstance(first, dict) or not isinstance(first.get("id"), str) or not _MODEL_NAME.fullmatch(first["id"]):
        raise ValueError("no data[0].id of 1 to 256 visible ASCII characters")
    n = first.get("max_model_len")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TOKENS):
        raise ValueError(f"max_model_len {str(n)[:40]} is not an integer in [1, {MAX_TOKENS}]")
    return first["id"], n
