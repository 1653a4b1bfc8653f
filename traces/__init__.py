"""Traces: the data layer. A trace is a directory of Parquet tables plus
``meta.json``; everything downstream (estimators, twin, routers, reports)
reads and writes that one format, so recorded and simulated traces are
interchangeable.

Rooms, bottom up (each room's ``__init__`` says what it holds and may
import; the ``traces-rooms`` contract in pyproject.toml enforces the order):

- ``errors``: the one error type for bad input (file, row, column; exit 2);
- ``datamodel``: the tables and their column types, the bounds on values,
  and the values every writer derives the same way;
- ``files``: the file boundary: what a command may read, strict JSON, and
  outputs written whole or not at all;
- ``checks``: what every table, meta.json and recording must satisfy;
- ``vllm_recorder``: the recorder that runs inside vLLM (standard library
  only);
- ``store``: reading and writing trace directories (``Trace``,
  ``TraceWriter``);
- ``steplog``: the engine's steps tables (``StepLog``); ``policies``: each
  request's SLO, accuracy and predicted length when the trace does not
  say; ``vllm_releases``: vLLM's defaults per release and the releases
  checked;
- ``importers``: public trace formats and vLLM's logs into traces;
  ``workload``: synthetic workloads and their arrivals; ``query`` and
  ``summary``: ``latroute trace query`` and ``trace info``;
- ``client_join``: a client's trace joined with the server's recording of
  the same run.

The bottom layer of latroute: imports nothing of latroute but itself
(``lint-imports``).
"""
