"""The baseline TTFT estimators the paper compares SFS against, and their
parameters.

- ``estimators``: each baseline over the same honest instance view as SFS;
- ``params``: their parameters (LPS service times, the queue-length fit),
  measured on the same traces a batch-time profile is calibrated on.

May import ``traces`` and ``estimators.engine`` (the view's layout) and the
modules beside this room that convert traces for the engine
(``estimators.trace_blocks``); never SFS, the time model, routers or the harness.
"""
