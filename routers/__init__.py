"""Routers: choose an instance for each arriving query from honest views of
the pool (docs/concepts/routing.md)."""
