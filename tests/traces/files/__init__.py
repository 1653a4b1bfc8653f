"""Tests of traces/files/: output directories under contention."""
