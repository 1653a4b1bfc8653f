"""The proxy's own ``/metrics`` (Prometheus text, prometheus-client):
decisions and their time, requests by backend and outcome, in flight per
backend (the ledger's count), and whether each backend is taking requests."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

DECISION_BUCKETS = [1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1]


class ProxyMetrics:
    def __init__(self, instance_ids: list[str], proxy):
        self.ids = instance_ids
        r = self.registry = CollectorRegistry()
        self.decisions = Histogram("latroute_route_decision_seconds", "Router time per routing decision.",
                                   buckets=DECISION_BUCKETS, registry=r)
        self.requests = Counter("latroute_route_requests", "Requests ended, by backend and outcome.",
                                ["instance_id", "status"], registry=r)
        self.up = Gauge("latroute_route_backend_up", "1 while the backend takes requests.", ["instance_id"],
                        registry=r)
        inflight = Gauge("latroute_route_in_flight", "Requests in flight per backend (the proxy's ledger).",
                         ["instance_id"], registry=r)
        for j, i in enumerate(instance_ids):
            self.up.labels(i).set(1)
            inflight.labels(i).set_function(lambda j=j: proxy.ledger.residents(j))

    def decided(self, us: float) -> None:
        self.decisions.observe(us / 1e6)

    def ended(self, row) -> None:
        self.requests.labels(row.instance_id or "", row.status).inc()

    def backend_up(self, j: int, up: bool) -> None:
        self.up.labels(self.ids[j]).set(1 if up else 0)

    def text(self) -> bytes:
        return generate_latest(self.registry)
