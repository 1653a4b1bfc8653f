"""Tests of harness/twin/: the engine twin, its baseline cache and host speed."""
