"""The studies whose tables and figures the results pages show, one module
each, run as ``latroute study NAME`` (``harness.cli.study``: the options,
the refusals, a lazy import of the module).

May import anything in latroute.
"""
