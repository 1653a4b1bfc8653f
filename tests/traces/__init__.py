"""Tests of traces/: the store and trace query here, one folder per room of traces below."""
