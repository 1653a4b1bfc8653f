"""Estimators: what a step or a request's TTFT will take, from honest views.

Rooms (each a subpackage whose docstring says what lives there and what it
may import):

- ``engine``: the engine model (scheduler, block pool, timing) in Numba,
  shared with the twin; the bottom of this layer.
- ``timemodel``: the batch-time model: profiles, their fit and calibration,
  and the host's speed (drift, the online factor, the rescale to a new host).
- ``sfs``: SFS, the TTFT estimate by simulating the scheduler forward.
- ``learned``: the learned estimator family (llm-d's predicted latency).
- ``baselines``: the baseline estimators and their measured parameters.
- ``evaluate``: error metrics and the conformal recalibration of quantiles.

Beside the rooms: ``snapshot`` (honest snapshots of a recorded instance),
``trace_blocks`` (a trace's prefix blocks for the engine), ``plugins`` and
``plugin_process`` (foreign estimators behind a guard), ``estimate``
(``latroute estimate``: every estimator over one trace) and ``kernel_cache``
(Numba's cache of every package's kernels kept true to the code; it runs
on import, below).

May import ``traces`` only; routers, reports and the harness sit above this
layer (``lint-imports``).
"""

from estimators.kernel_cache import drop_stale_kernels

drop_stale_kernels()  # before any kernel loads from Numba's cache (why: ``kernel_cache``)
