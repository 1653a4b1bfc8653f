"""Tests of harness/, one folder per room."""
