"""Plug-ins are foreign code: loading one, calling it, and the one error
that says which plug-in failed where.

Routers (``routers.registry``) and TTFT estimators (``estimators.estimate``)
may be named by import path ``module:attr``. What a plug-in does is not
latroute's: it may fail to import, raise in its constructor or at any
call, or answer something that is not an answer (an instance index out of
range, NaN, a string; a negative or non-finite estimate). Each of these is
the user's input being wrong, not a bug of latroute, so it is reported as
bad input (exit 2) in one line naming the plug-in and, where there is one,
the request: ``error: plug-in 'mod:Class' at request 17: choose() raised
ZeroDivisionError: division by zero``. This module sits under both users
(estimators import no routers).
"""
from __future__ import annotations

import importlib
import math
import reprlib
from collections.abc import Callable
from typing import Any

import numpy as np

from traces.errors import BadInput

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60


def short_repr(x: object) -> str:
    """A plug-in's answer as the error shows it (bounded: it may be huge)."""
    try:
        return _REPR.repr(x)
    except Exception:  # noqa: BLE001 - a foreign __repr__ may raise anything
        return f"<{type(x).__name__}>"


class PluginError(BadInput):
    """A plug-in failed: shown as ``plug-in 'PATH' [at request R]: reason``."""

    def __init__(self, path: str, reason: str, request: object = None):
        self.path, self.request = path, request
        super().__init__(path, None, "plug-in", reason)

    def __reduce__(self):
        """Pickled by its fields: a sweep's worker process raises it, the parent reports it."""
        return (PluginError, (self.path, self.reason, self.request))

    def at_request(self, request: object) -> PluginError:
        """The same error, naming the request being decided (the caller knows
        its id; the plug-in's wrapper knows only its position)."""
        return PluginError(self.path, self.reason, request)

    def __str__(self) -> str:
        at = "" if self.request is None else f" at request {self.request}"
        return f"plug-in {self.path!r}{at}: {self.reason}"


def load(path: str, kind: str, importer: Callable[[str], Any]) -> Any:
    """The object named by ``module:attr`` (``kind`` says what it should be,
    for the error). Anything its import raises is the plug-in's failure.
    ``importer`` is the standard library's import-by-name, passed by the plug-in
    loaders themselves (``tests/project/test_import_layers.py`` keeps imports by name to
    them)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr or ":" in attr:
        raise PluginError(path, f"cannot be loaded: a {kind} plug-in is named module:attr")
    try:
        module = importer(module_name)
    except Exception as e:  # noqa: BLE001 - foreign code: its import may raise anything
        raise PluginError(path, f"cannot be loaded: importing it raised {type(e).__name__}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise PluginError(path, f"cannot be loaded: module {module_name!r} has no attribute {attr!r}") from None


def call(path: str, what: str, fn: Callable, *args) -> Any:
    """``fn(*args)``, a plug-in's code: its exception becomes a ``PluginError``
    saying what raised (``what``: ``__init__``, ``choose()``, ...)."""
    try:
        return fn(*args)
    except PluginError:
        raise
    except Exception as e:  # noqa: BLE001 - foreign code may raise anything
        raise PluginError(path, f"{what} raised {type(e).__name__}: {e}") from e


def real_number(x: object) -> bool:
    """A plain real number: int or float (Python or NumPy), not a bool."""
    return isinstance(x, int | float | np.integer | np.floating) and not isinstance(x, bool | np.bool_)


def checked_seconds(path: str, what: str, x: object) -> float:
    """An estimate a plug-in returned: a finite number of seconds >= 0."""
    if not real_number(x):
        raise PluginError(path, f"{what} returned {short_repr(x)} ({type(x).__name__}), not a number of seconds")
    v = float(x)
    if not math.isfinite(v) or v < 0:
        raise PluginError(path, f"{what} returned {v!r}: an estimate must be finite and >= 0 seconds")
    return v


class PluginEstimator:
    """A TTFT estimator plug-in behind a guard: its constructor, every
    ``estimate`` and ``last_dist`` call and its ``speed`` setter run through
    ``call``; each estimate is checked (``checked_seconds``). The snapshot
    it is handed is as honest as the built-ins' (``estimators.snapshot``)."""

    def __init__(self, path: str, cls: Callable, *args):
        if not callable(cls):
            raise PluginError(path, f"is a {type(cls).__name__}, not an estimator class")
        inner = call(path, "__init__", cls, *args)
        if not callable(getattr(inner, "estimate", None)):
            raise PluginError(path, "has no estimate(snapshot, query) method")
        self.inner, self.name = inner, path
        self._speed = 1.0
        if callable(getattr(inner, "last_dist", None)):
            self.last_dist = self._last_dist
        self.speed = getattr(inner, "speed", 1.0) if real_number(getattr(inner, "speed", 1.0)) else 1.0

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        self._speed = value
        call(self.name, "setting speed", setattr, self.inner, "speed", value)

    def estimate(self, view, q) -> float:
        return checked_seconds(self.name, "estimate()", call(self.name, "estimate()", self.inner.estimate, view, q))

    def _last_dist(self, slo: float):
        d = call(self.name, "last_dist()", self.inner.last_dist, slo)
        try:
            parts = tuple(d)[:4]
        except TypeError:
            raise PluginError(self.name, f"last_dist() returned {short_repr(d)}, not (mean, p50, p90, p99)") from None
        if len(parts) < 4:
            raise PluginError(self.name, f"last_dist() returned {len(parts)} values, not (mean, p50, p90, p99)")
        return tuple(checked_seconds(self.name, "last_dist()", v) for v in parts)


def build_estimator(path: str, *args) -> PluginEstimator:
    """The estimator plug-in ``module:Class`` loaded and built behind its guard (in-process, or in the
    child of an isolated one: ``estimators.plugin_process``)."""
    return PluginEstimator(path, load(path, "estimator", importlib.import_module), *args)
