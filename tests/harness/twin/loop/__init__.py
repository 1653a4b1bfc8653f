"""Tests of harness/twin/loop/: the fleet loop, event skipping and the async loop."""
