"""latroute's harness: everything that drives the layers below it.

Rooms (each a subpackage whose docstring says what lives there and what it
may import):

- ``cli``: the ``latroute`` command line, one module per command group.
- ``twin``: the engine twin (discrete-event replay of a pool), pools, the
  stale router view, router replays and the twin's fidelity checks.
- ``sweep``: many replays as cells on a process pool or Ray, written as they
  finish.
- ``requestlevel``: request-level traces: vLLM's API front end, the engine
  reconstructed behind them, profile fits and validation.
- ``bench``: ``latroute bench``'s measurements.
- ``live``: what touches a real engine or server: recording vLLM, load
  generation.
- ``studies``: scripted studies whose results the docs cite.

The harness is the top layer: it may import ``traces``, ``estimators``,
``routers`` and ``reports``; nothing below imports it (``lint-imports``).
"""

import estimators  # noqa: F401,E402 (its import drops stale cached kernels before any loads: ``estimators.kernel_cache``)
