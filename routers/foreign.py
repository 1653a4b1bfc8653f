"""A router plug-in behind a guard (``PluginRouter``).

A plug-in router is foreign code (``estimators.plugins``): the twin must
not index its instances with whatever the plug-in returns (``-1`` would
silently be the last instance, ``True`` the second), nor turn its
exception into latroute's internal error. The guard times the plug-in's
decisions like ``Router.__call__``, refuses an exception or an answer that
is not an instance index as ``error: plug-in 'mod:Class' ...`` (the twin
adds the request id), and carries the registry entry's ``oracle`` flag, so
that only an entry that declares it is handed the live instances
(``harness.twin.simulation``), whatever the plug-in object says of itself.
"""
from __future__ import annotations

import time

import numpy as np

from estimators.plugins import PluginError, call, short_repr


class PluginRouter:
    """``router(i, t, views) -> instance index`` around a plug-in's router."""

    def __init__(self, inner, path: str, oracle: bool = False):
        if not callable(inner):
            raise PluginError(path, f"built a {type(inner).__name__}, not a router (callable as router(i, t, views))")
        self.inner, self.name, self.path, self.oracle = inner, path, path, oracle
        self.decision_ns = 0
        self.decisions = 0

    def __call__(self, i: int, t: float, insts) -> int:
        t0 = time.perf_counter_ns()
        j = call(self.path, "choose()", self.inner, i, t, insts)
        self.decision_ns += time.perf_counter_ns() - t0
        self.decisions += 1
        n = len(insts)
        if type(j) is int or (isinstance(j, np.integer) and not isinstance(j, bool | np.bool_)):
            if 0 <= j < n:
                return int(j)
            raise PluginError(self.path, f"choose() returned instance {int(j)}, not in 0..{n - 1}")
        raise PluginError(self.path, f"choose() returned {short_repr(j)} ({type(j).__name__}), "
                                     f"not an instance index in 0..{n - 1}")

    @property
    def mean_decision_us(self) -> float:
        return self.decision_ns / self.decisions / 1e3 if self.decisions else float("nan")
