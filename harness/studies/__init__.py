"""Scripted studies whose figures the docs cite, run as ``python -m
harness.studies.NAME``.

May import anything in latroute.
"""
