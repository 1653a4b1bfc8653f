"""Traces: the data model (schema), the on-disk store, importers of public
trace formats and the synthetic workload generator.

A trace is a directory of Parquet tables plus ``meta.json``; everything
downstream (estimators, twin, routers, reports) reads and writes that one
format, so recorded and simulated traces are interchangeable.

The bottom layer: imports nothing of latroute but itself (``lint-imports``).
"""
