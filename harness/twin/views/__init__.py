"""What a router is handed of the twin's instances.

- ``honest``: ``HonestView``, one instance as an honest estimator may read it;
- ``fleet``: ``FleetViews``, the views of a pool plus the per-instance arrays
  a fleet router reads without walking every view;
- ``stale``: what a production router sees (state published at an interval,
  with the router's own dispatches since).

May import ``estimators`` and ``harness.twin.loop`` (the layouts of the
loop's bundles); never the simulation, pools or routers.
"""
