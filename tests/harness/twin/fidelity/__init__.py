"""Tests of harness/twin/fidelity/: decision agreement and validation against real engines."""
