"""Tests of harness/cli/: the command line's surface, help, error path and signals."""
