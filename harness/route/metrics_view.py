"""The ``metrics`` view: what a gateway that reads vLLM's ``/metrics`` sees
(llm-d's scorers read these gauges), plus the proxy's ledger for what it
sent since.

Every ``--poll-interval`` milliseconds (the backends' time: wall time
times ``--speed``) each backend's ``/metrics``
is read for ``vllm:num_requests_running``, ``vllm:num_requests_waiting``
and ``vllm:kv_cache_usage_perc``. At each answer the backend's view is
*published* as the stale view of the offline twin publishes one
(``harness.twin.views.stale.publish``): a copy of the ledger's engine
reconstruction (``harness.route.ledger``) at that instant; when the gauges
count more requests on the backend than the ledger knows (traffic that did
not come through this proxy), the difference joins the copy as arrivals of
a stand-in request (the ledger's mean prompt and predicted length in
flight, or 256 and 128 when it has none). Until the next answer the view
stays as published, and every request the proxy sends there joins it as
an arrival not yet taken in (``StaleViews.dispatched``: the ledger of what
was sent since). The stand-ins of one answer join in one call
(``StaleViews.dispatched_many``). A backend whose ``/metrics`` cannot be read is reported
to the proxy, which counts it dead.

A ``/metrics`` page is untrusted input: it is read up to ``MAX_PAGE``
bytes, each gauge must be a finite number >= 0 (the KV usage at most 1),
and the stand-ins one answer adds are at most the instance's
``max_num_seqs`` (what one engine runs at once: beyond it, more requests
only wait, and the view's queue of stand-ins would cost every decision
time for nothing). A page that breaks a bound is reported as one that
cannot be read; the poller itself never stops while the proxy runs.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from aiohttp import ClientError, ClientTimeout

from harness.route.backend_tasks import BackendTasks
from harness.route.backends import Backend
from harness.route.forward import BackendFailed, bounded_read
from harness.route.ledger import Ledger
from harness.serve.clock import Clock
from harness.twin.views.stale import StaleViews, ViewConfig, publish

GAUGES = {b"vllm:num_requests_running": "running", b"vllm:num_requests_waiting": "waiting",
          b"vllm:kv_cache_usage_perc": "kv"}
DEFAULT_STAND_IN = (256, 128)  # prompt, predicted output tokens of a stand-in when the ledger has no request
MAX_PAGE = 8 << 20  # bytes of one /metrics page (vLLM's are tens of kB)


class BadPage(ValueError):
    """A /metrics page the proxy refuses."""


@dataclass
class Gauges:
    running: float = 0.0
    waiting: float = 0.0
    kv: float = 0.0


def read_gauges(text: bytes) -> Gauges:
    """The three gauges from a Prometheus text page (summed over label
    sets: one engine per server), by a line scan: the full parser costs
    milliseconds per page, and pages come every poll from every backend."""
    g = Gauges()
    for line in text.split(b"\n"):
        if not line.startswith(b"vllm:"):
            continue
        name = line.split(b"{", 1)[0].split(b" ", 1)[0]
        attr = GAUGES.get(name)
        if attr is not None:
            try:
                v = float(line.rsplit(b" ", 1)[1])
            except (ValueError, IndexError):
                continue
            if not (math.isfinite(v) and v >= 0):
                raise BadPage(f"{name.decode()} is {v}, not a finite number >= 0")
            setattr(g, attr, getattr(g, attr) + v)
    if g.kv > 1.0 + 1e-9:
        raise BadPage(f"vllm:kv_cache_usage_perc is {g.kv}, above 1")
    return g


class MetricsViews(BackendTasks):
    def __init__(self, backends: list[Backend], ledger: Ledger, clock: Clock, interval_s: float, stand_in: int,
                 inputs, on_fail=None):
        self.backends, self.ledger, self.clock, self.interval = backends, ledger, clock, interval_s
        self.stale = StaleViews(ViewConfig(interval_ms=interval_s * 1e3, ledger=True))
        self.stale.predicted = inputs.pred_total
        self.inputs, self.stand_in = inputs, stand_in
        t = clock.now()
        self.stale.views = [publish(s.inst, t) for s in ledger.shadows]
        self.published = [t] * len(backends)
        self.polls = [0] * len(backends)
        self.gauges = [Gauges() for _ in backends]
        self.on_fail = on_fail or (lambda j, reason: None)

    async def _read(self, j: int) -> None:
        url = self.backends[j].url + "/metrics"
        timeout = ClientTimeout(total=max(self.interval * 5, 1.0))
        while True:
            try:
                async with self.session.get(url, timeout=timeout) as r:
                    body = await bounded_read(r, MAX_PAGE)
                    ok = r.status == 200
                if ok:
                    self.publish(j, read_gauges(body))
                else:
                    self.on_fail(j, f"GET /metrics answered HTTP {r.status}")
            except BadPage as e:
                self.on_fail(j, f"GET /metrics refused: {e}")
            except BackendFailed as e:
                self.on_fail(j, f"GET /metrics failed: {e.reason}")
            except (ClientError, TimeoutError, OSError) as e:
                self.on_fail(j, f"GET /metrics failed ({type(e).__name__})")
            except Exception as e:  # noqa: BLE001 - whatever a page does, the poller lives on and says why
                self.on_fail(j, f"GET /metrics not usable ({type(e).__name__}: {str(e)[:120]})")
            await asyncio.sleep(self.interval)

    def publish(self, j: int, g: Gauges) -> None:
        """Backend ``j``'s view, as of now: the ledger's reconstruction, plus
        stand-ins for what the gauges count beyond it."""
        t = self.clock.now()
        shadow = self.ledger._now(j, t)
        view = publish(shadow.inst, t)
        self.stale.views[j] = view
        self.published[j], self.gauges[j] = t, g
        self.polls[j] += 1
        seqs = int(self.backends[j].spec.config.max_num_seqs)
        extra = min(int(min(g.running + g.waiting, 2.0 * seqs)) - view.residents, seqs)
        if extra > 0:
            self._stand_in(j)
            self.stale.dispatched_many(j, self.stand_in, int(self.inputs.prompt[self.stand_in]), extra)

    def _stand_in(self, j: int) -> None:
        mine = [e for e in self.ledger.entries.values() if e.backend == j]
        if mine:
            prompt = round(sum(e.prompt for e in mine) / len(mine))
            pred = round(sum(int(self.inputs.pred_total[i]) for i, e in self.ledger.entries.items()
                             if e.backend == j) / len(mine))
        else:
            prompt, pred = DEFAULT_STAND_IN
        self.inputs.prompt[self.stand_in], self.inputs.pred_total[self.stand_in] = prompt, max(pred, 1)

    # --- what the proxy asks
    def views(self, t: float) -> list:
        """As published (their ``t`` the publication's, as the twin's stale views keep theirs)."""
        return self.stale.views

    def ages(self, t: float) -> list[float]:
        return [max(t - p, 0.0) for p in self.published]

    def sent(self, j: int, i: int, prompt: int, client_id: str = "") -> None:
        self.stale.dispatched(j, i, prompt)
