"""latroute: harness."""
