"""Emulated vLLM servers (``latroute serve``): the twin's instances behind
vLLM's OpenAI API, Prometheus metrics and a recording, in real time.

One module per job: ``clock`` (twin time to wall time, ``--speed``),
``abort`` (a request taken out of the engine, its blocks freed),
``engine`` (one instance stepped in real time by the twin's kernel),
``protocol`` (request parsing and vLLM's error body), ``metrics``
(vLLM's metric names and label sets), ``app`` (the aiohttp routes and SSE),
``recording`` (the trace ``--record`` writes), ``server`` (every instance
of a pool on its own port, signals, the lag report). aiohttp and
prometheus_client are imported only here (extra ``serve``).

May import ``harness.twin`` and the layers below the harness.
"""
