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

from estimators.plugin_process import PluginProcess
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


class IsolatedRouter:
    """A plug-in router living in a child process (``estimators.plugin_process``): built there by
    ``build(path, context)`` (the registry's plug-in entry, guard included), handed copies of each
    decision's honest views. Its decision time includes the round trip: that is what isolation costs."""

    oracle = False  # an oracle is handed the live instances, which cannot leave the process: refused
    sheds = False
    reads = "views"

    def __init__(self, path: str, build, context, timeout_s: float):
        self.name = self.path = path
        self.proc = PluginProcess(path, build, (path, context), timeout_s)
        self.decision_ns = 0
        self.decisions = 0

    def __call__(self, i: int, t: float, insts) -> int:
        t0 = time.perf_counter_ns()
        j = self.proc.call("__call__", int(i), float(t), insts)
        self.decision_ns += time.perf_counter_ns() - t0
        self.decisions += 1
        return j

    def close(self) -> None:
        self.proc.close()

    @property
    def mean_decision_us(self) -> float:
        return self.decision_ns / self.decisions / 1e3 if self.decisions else float("nan")
