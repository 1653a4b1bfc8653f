"""Tests of harness/live/: loadgen against real and misbehaving servers."""
