"""Calling a compiled kernel without Numba's per-call argument typing.

Numba's dispatcher types every argument on every call; for named tuples
this costs about 1 µs per bundle (arrays pass its C fast path, tuples do
not), which would double the cost of an SFS estimate at small states.
``entry_point`` compiles (or loads from the cache) the one signature the
bundles always have and returns its entry point, which only unboxes. The
caller must pass arguments of exactly those types (the bundles' own
constructors guarantee it).
"""
from __future__ import annotations

from collections.abc import Callable

from numba import typeof


def entry_point(dispatcher, *example_args) -> Callable:
    """The compiled entry of ``dispatcher`` for the types of ``example_args``."""
    return dispatcher.compile(tuple(typeof(a) for a in example_args))
