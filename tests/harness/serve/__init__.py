"""Tests of harness/serve/: latroute serve, its engine, HTTP, prefix cache and untrusted clients."""
