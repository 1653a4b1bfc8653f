"""What requests a run sends: synthetic workloads and their arrival times.

- ``generator``: ``latroute trace generate``, the requests and quality
  tables of a trace not served yet, each ingredient from its own seed;
- ``sessions``: multi-turn chat sessions (``--sessions``), the workload
  where prefix caching pays;
- ``arrivals``: the arrival processes (Poisson, gamma as ``vllm bench
  serve`` draws them, a two-state MMPP, the Azure shape);
  ``azure_shape``: the Azure conversation trace's arrival shape, rescaled
  to any mean rate;
- ``synth_azure``: large Azure-format CSV files for import benchmarks.

May import ``traces.policies`` (each request's SLO, accuracy and task),
the store, ``traces.files`` and ``traces.errors``; never the importers.
"""
