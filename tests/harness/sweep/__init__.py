"""Tests of harness/sweep/: sweeps at scale and with isolated plug-ins."""
