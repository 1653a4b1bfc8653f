"""Tests of routers/: every built-in router and the fleet's two-level routing."""
