"""Scripted studies whose figures the docs cite, run as ``python -m
harness.studies.NAME``; ``study_args`` gives their command lines
latroute's one-line refusals.

May import anything in latroute.
"""
