"""The data model: what a trace's tables hold, and the values every writer
derives the same way.

- ``schema``: the tables and their column types, one schema for recorded,
  imported, generated and simulated traces;
- ``limits``: the largest numbers latroute accepts (every count an int64,
  every time a float64, and the squares the batch aggregates take), with why;
- ``step_aggregates``: the per-step sums the ``steps`` table stores,
  computed once from step items for recordings and the twin alike;
- ``prefix_blocks``: a trace's prefix hash ids mapped onto an engine's
  full KV blocks.

The bottom of ``traces``: it imports nothing of latroute but itself (and
may import ``traces.errors``), so every room above reads one definition
and the engine's own copies of its constants are checked against it.
"""
