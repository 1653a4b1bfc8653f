"""The engine twin: a discrete-event model of a pool of vLLM instances.

``simulation`` runs a pool on the shared scheduler kernel (``estimators.engine``)
with ``kernel`` as its compiled inner loop, one ``instance`` per server (the
view routers read, and the oracle's clairvoyant fork); ``pools`` names the built-in pools
and reads pool files; ``stale_view`` is what a production router sees;
``replay`` routes one workload through one router; ``validate`` and
``decisions`` check the twin against real recordings; ``memory`` says
whether a pool's scheduler state fits the machine before it is allocated.

May import ``traces``, ``estimators``, ``routers`` and ``reports``; never the
command line, sweeps or the live room.
"""
