"""Request-level traces: arrivals, lengths and measured TTFTs, no engine steps.

``request_trace`` is such a trace, checked; ``frontend`` (compiled loop in
``frontend_kernel``, costs measured by ``frontend_burst``) is vLLM's API
server as a transform of arrivals; ``engine_options`` is the engine a trace
does not describe; ``fleet`` is the replicas behind a log and how they
shared it; ``replay`` replays a trace on one engine or a fleet
(``fleet_replay``: least requests, the replicas' results merged), with
``cache`` and ``delivery``; ``reconstruct`` writes the replay as a trace for
the estimators; ``fit`` calibrates a profile with the twin in the loop,
within the ranges of ``fit_bounds`` (the weight-read floor from
``weight_floor``), with intervals from ``fit_uncertainty`` and our own
simplex (``simplex``); ``validate`` scores the twin on such a trace,
``active_replicas`` finds how many of a fleet a run's completions imply and
``engine_view`` scores it by vLLM's own stamps; ``score_window`` is the
least a score window must hold.

May import ``harness.twin`` and the layers below the harness.
"""
