"""Tests of harness/twin/views/: what routers see (stale views, no true lengths)."""
