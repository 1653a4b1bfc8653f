"""SFS (serving-framework simulation): a TTFT estimate made by running the
engine's scheduler forward from an honest view of the instance.

- ``estimator``: ``SFS``, the Python side (profile, scratch state, one
  ``estimate(view, query)`` entry point);
- ``kernel``: the simulation in Numba, synchronous and with vLLM's async
  scheduling, stepped through the engine loop
  (``estimators.engine.step_loop``); ``dist``: the TTFT as a distribution;
- ``bound`` and ``bound_kernel``: a cheap lower bound on the estimate, for
  pruning replicas.

May import ``traces``, ``estimators.engine`` and ``estimators.timemodel``;
never the other estimator families, routers or the harness.
"""
