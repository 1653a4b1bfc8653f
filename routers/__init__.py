"""Routers: choose an instance for each arriving query from honest views of
the pool (docs/concepts/routing.md).

May import ``traces`` and ``estimators`` (never ``estimators.engine``'s
arrays directly: routers read views); never the harness (``lint-imports``).
"""
