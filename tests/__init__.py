"""The test suite, one folder per package it guards (tests/a/b/ guards a/b/), plus project/ (house-wide checks) and
refusals/ (bad input refused), and the helpers in support/, peer/ and data/; tests/project/test_test_layout.py holds the rules."""
