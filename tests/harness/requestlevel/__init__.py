"""Tests of harness/requestlevel/: request-level traces, the front end, the fit and fleets of request logs."""
