"""The engine twin: a discrete-event model of a pool of vLLM instances.

Rooms (each a subpackage whose docstring says what lives there and what it
may import):

- ``loop``: the compiled inner loop that advances one instance (synchronous
  and async scheduling, event skipping, the online speed rule);
- ``views``: what routers are handed (``HonestView``, ``FleetViews``, the
  stale view a production router sees);
- ``pools``: built-in pools and pool files, and whether a pool fits memory;
- ``fidelity``: the twin checked against real recordings (``validate``,
  decision agreement).

Beside the rooms: ``simulation`` runs a pool on the shared scheduler kernel
(``estimators.engine``), one ``instance`` per server (the view routers read,
and the oracle's clairvoyant fork), ordered by ``event_queue`` and advanced
several at a time by ``fleet_kernel``; ``replay`` routes one workload through
one router, with the baselines' parameters measured once per pool
(``pool_baselines``, cached on disk by ``baseline_cache``).

May import ``traces``, ``estimators``, ``routers`` and ``reports``; never the
command line, sweeps or the live room.
"""
