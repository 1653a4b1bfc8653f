"""``latroute route``: any latroute router in the request path, as an
OpenAI-compatible proxy in front of vLLM (or ``latroute serve``) backends.

One module per job: ``backends`` (which servers, with what engine, prices
and profile), ``inputs`` (each request's SLO, predicted accuracy and length:
from its headers or fields, else the policies ``replay`` uses), ``ledger``
(the proxy's own record per backend, the engine state reconstructed from it
with the kernel: the ``ledger`` view), ``metrics_view`` (vLLM's ``/metrics``
polled, plus the ledger since: the ``metrics`` view), ``forward`` (one
request sent to one backend, its answer streamed back unchanged),
``decisions`` (the decision log, written as a latroute trace), ``proxy``
(the aiohttp routes and the routing step), ``server`` (binding, signals,
the log written at exit). aiohttp and prometheus_client are imported only
here (extra ``serve``).

May import ``harness.serve``, ``harness.twin`` and the layers below the harness.
"""
