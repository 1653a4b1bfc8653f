"""Tests of traces/datamodel/: prefix blocks and per-step aggregates."""
