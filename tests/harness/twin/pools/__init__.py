"""Tests of harness/twin/pools/: pool files, replica pools and memory bounds."""
