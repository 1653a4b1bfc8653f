"""Tests of harness/studies/: the studies' pure parts on tiny inputs."""
