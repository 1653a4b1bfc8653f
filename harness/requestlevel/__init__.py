"""Request-level traces: arrivals, lengths and measured TTFTs, no engine steps.

``frontend`` (compiled loop in ``frontend_kernel``, costs measured by
``frontend_burst``) is vLLM's API server as a transform of arrivals;
``engine_options`` is the engine a trace does not describe; ``reconstruct``,
``cache`` and ``delivery`` rebuild the engine behind the trace on the twin;
``fit`` calibrates a profile with the twin in the loop, within the ranges of
``fit_bounds`` (the weight-read floor from ``weight_floor``), with intervals
from ``fit_uncertainty`` and our own simplex (``simplex``); ``validate`` scores
the twin on such a trace.

May import ``harness.twin`` and the layers below the harness.
"""
