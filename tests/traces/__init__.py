"""Tests of traces/: the store, importers, workloads, sessions, the recorder and output directories."""
