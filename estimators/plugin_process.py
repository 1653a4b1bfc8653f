"""A plug-in run in a process of its own (``--isolate-plugins``).

Why: a plug-in running in latroute's process can reach anything in it.
The honest views keep no reference to the truth, but Python gives foreign
code other ways in -- ``gc.get_objects()``, ``gc.get_referrers``, the
caller's frames -- and no in-process code can be sealed off from the
process it runs in. Isolation moves the plug-in where the truth is not: a
child process started fresh (``spawn``: nothing of the parent's memory is
inherited), built there from arguments that are themselves honest, and
handed each call's arguments -- the honest views, the query -- as copies
(pickled over a pipe). What the child can walk is what it was sent.

The price is a round trip per call (the arguments pickled, sent, unpickled;
the answer back), measured per decision in the results page on plug-ins.
A child that raises, answers something unpicklable, dies, or takes longer
than the per-call limit is a ``PluginError`` naming the plug-in (the caller
adds the request); a child that overran its limit is killed.
"""
from __future__ import annotations

import multiprocessing as mp
import pickle
from collections.abc import Callable
from typing import Any

from estimators.plugins import PluginError, build_estimator

DEFAULT_TIMEOUT_S = 10.0  # per call (and for the build); a CLI option replaces it
MAX_TIMEOUT_S = 3600.0
START_TIMEOUT_S = 120.0  # the child's start: a fresh interpreter importing NumPy and the plug-in's modules


def _child(conn, build: Callable[..., Any], args: tuple) -> None:
    """The child's loop: build the plug-in, then answer ``(method, args)`` calls until told to stop."""
    try:
        obj = build(*args)
    except PluginError as e:
        conn.send(("plugin-error", e.reason))
        return
    except Exception as e:  # noqa: BLE001 - foreign code: its construction may raise anything
        conn.send(("plugin-error", f"__init__ raised {type(e).__name__}: {e}"))
        return
    conn.send(("ok", None))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        method, margs = msg
        try:
            out = ("ok", getattr(obj, method)(*margs))
        except PluginError as e:
            out = ("plugin-error", e.reason)
        except Exception as e:  # noqa: BLE001 - foreign code may raise anything
            out = ("plugin-error", f"{method} raised {type(e).__name__}: {e}")
        try:
            conn.send(out)
        except Exception as e:  # noqa: BLE001 - an answer that does not pickle
            conn.send(("plugin-error", f"{method} returned an answer that cannot be sent back: "
                                       f"{type(e).__name__}: {e}"))


class PluginProcess:
    """``build(*args)`` run in a child process; ``call(method, *args)`` calls the built object there.

    ``build`` and ``args`` must pickle (a module-level function and honest data). ``timeout_s``
    bounds every call; the build gets ``START_TIMEOUT_S`` more for the interpreter's start."""

    def __init__(self, path: str, build: Callable[..., Any], args: tuple, timeout_s: float = DEFAULT_TIMEOUT_S):
        self.path, self.timeout_s = path, float(timeout_s)
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        try:
            self._proc = ctx.Process(target=_child, args=(child, build, args), daemon=True)
            self._proc.start()
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            raise PluginError(path, f"cannot be isolated: what it is built from does not pickle "
                                    f"({type(e).__name__}: {e})") from None
        finally:
            child.close()
        self._answer("__init__", START_TIMEOUT_S + self.timeout_s)

    def call(self, method: str, *args) -> Any:
        if self._proc is None:
            raise PluginError(self.path, "its process was stopped after an earlier failure")
        try:
            self._conn.send((method, args))
        except (BrokenPipeError, EOFError, OSError):
            self._failed(f"its process died before {method}")
        return self._answer(method, self.timeout_s)

    def _answer(self, what: str, timeout_s: float) -> Any:
        try:
            ready = self._conn.poll(timeout_s)
        except (EOFError, OSError):
            ready = True
        if not ready:
            self._failed(f"{what} did not answer within {timeout_s:g} s (the per-call limit; --plugin-timeout)")
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(1.0)
            self._failed(f"its process died during {what} (exit code {self._proc.exitcode})")
        if kind != "ok":
            self._failed(value)
        return value

    def _failed(self, reason: str):
        self.close()
        raise PluginError(self.path, reason)

    def close(self) -> None:
        """Stop the child (politely, then by force); idempotent."""
        proc, self._proc = getattr(self, "_proc", None), None
        if proc is None:
            return
        try:
            self._conn.send(None)
        except (BrokenPipeError, EOFError, OSError):
            pass
        proc.join(0.5)
        if proc.is_alive():
            proc.kill()
            proc.join(1.0)
        self._conn.close()

    def __del__(self):
        self.close()


class _EstimatorHost:
    """The child's side of an isolated estimator: the guarded plug-in (``PluginEstimator``) and one
    call per estimate that carries the host speed with it (the parent sets it before every estimate)."""

    def __init__(self, path: str, args: tuple):
        self.est = build_estimator(path, *args)

    def has_dist(self) -> bool:
        return hasattr(self.est, "last_dist")

    def estimate_at(self, speed: float, view, q) -> float:
        if speed != self.est.speed:
            self.est.speed = speed
        return self.est.estimate(view, q)

    def last_dist(self, slo: float):
        return self.est.last_dist(slo)


class IsolatedEstimator:
    """A TTFT estimator plug-in in a child process: built there as ``estimators.estimate.
    plugin_estimator`` builds it in-process, handed a copy of each snapshot and query."""

    def __init__(self, path: str, args: tuple, timeout_s: float):
        self.name = path
        self.proc = PluginProcess(path, _EstimatorHost, (path, args), timeout_s)
        self.speed = 1.0
        if self.proc.call("has_dist"):
            self.last_dist = self._last_dist

    def estimate(self, view, q) -> float:
        return self.proc.call("estimate_at", float(self.speed), view, q)

    def _last_dist(self, slo: float):
        return self.proc.call("last_dist", slo)

    def close(self) -> None:
        self.proc.close()
