"""Pools of serving instances as the twin takes them.

- ``spec``: built-in pools and pool files (engine configuration, prices and
  each instance's batch-time profile);
- ``memory``: whether a pool's scheduler state fits this machine before it
  is allocated.

May import ``traces`` and ``estimators``; never the simulation, routers or
the command line.
"""
