"""Tests of traces/policies/: what a trace lacks (SLOs, quality, lengths) and the user's own models."""
