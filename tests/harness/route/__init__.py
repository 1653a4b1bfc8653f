"""Tests of harness/route/: latroute route as a proxy, its parts, and untrusted backends and clients."""
