"""A plug-in router for the tests and the README's example: always the
last instance (the pool's largest model)."""
from __future__ import annotations

import numpy as np

from routers.base import Router


class LastInstance(Router):
    """always the last instance of the pool"""

    summary = "always the last instance"

    def choose(self, i: int, t: float, insts) -> int:
        return len(insts) - 1


class TwiceThroughput:
    """A plug-in TTFT estimator: twice the prompt's prefill time at the
    profile's prefill rate (needs baseline parameters)."""

    def __init__(self, profile, params, pred_total, frontend_overhead_s):
        self.theta, self.overhead = params.theta_pre, frontend_overhead_s

    def estimate(self, snap, q) -> float:
        return 2.0 * q.prompt / self.theta * self.speed + self.overhead


# --- plug-ins that look at everything they are given, and plug-ins that misbehave

SEEN: list = []  # per call of a walking plug-in: (time, the ints it reached in BAND, every float it reached)
BAND = (1_000_000, 2_000_000)  # the tests make true lengths distinct numbers in here (kept: the rest is dropped)
WALK_LIMIT = 200_000  # objects visited per call at most (bounded, whatever it is given)


def walk_numbers(*roots, limit: int = WALK_LIMIT, skip_numba: bool = False) -> tuple:
    """Every number reachable from ``roots`` by attribute walking: object
    attributes (``vars``, ``__slots__``, properties), containers, NumPy
    arrays and their bases, closures and defaults of functions, bound
    methods' objects. (Modules and classes are not entered: through them
    everything in the process is reachable.)"""
    import types

    import numpy as np

    ints, floats, arrays = [], [], []
    seen, stack, visits = set(), list(roots), 0
    while stack and visits < limit:
        o = stack.pop()
        if id(o) in seen or isinstance(o, types.ModuleType | type | str | bytes) or o is None:
            continue
        if skip_numba and type(o).__module__.startswith("numba"):
            continue  # the twin's compiled state: its typed containers are not safe to walk from Python
        seen.add(id(o))
        visits += 1
        if isinstance(o, bool):
            continue
        if isinstance(o, int | np.integer):
            ints.append(int(o))
        elif isinstance(o, float | np.floating):
            floats.append(float(o))
        elif isinstance(o, np.ndarray):
            if o.dtype.kind in "iu":
                arrays.append(("i", o.ravel()))
            elif o.dtype.kind == "f":
                arrays.append(("f", o.ravel()))
            elif o.dtype == object:
                stack.extend(o.ravel().tolist())
            if o.base is not None:
                stack.append(o.base)
        elif isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set | frozenset):
            stack.extend(o)
        elif isinstance(o, types.MethodType):
            stack.extend((o.__self__, o.__func__))
        elif isinstance(o, types.FunctionType):
            stack.extend(c.cell_contents for c in (o.__closure__ or ()) if c.cell_contents is not None)
            stack.extend(o.__defaults__ or ())
        elif isinstance(o, types.BuiltinFunctionType | types.WrapperDescriptorType):
            continue
        else:
            try:
                names = dir(o)
            except ReferenceError:  # a weak proxy whose object was collected: nothing left to read
                continue
            for name in names:
                if name.startswith("__") and name not in ("__dict__", "__slots__"):
                    continue
                try:
                    stack.append(getattr(o, name))
                except Exception:  # noqa: BLE001 - a property may refuse: nothing to read there
                    pass
    i = np.concatenate([np.asarray(ints, dtype=np.int64)] + [a.astype(np.int64) for k, a in arrays if k == "i"])
    f = np.concatenate([np.asarray(floats, dtype=np.float64)] + [a for k, a in arrays if k == "f"])
    return i, f


class Walker(Router):
    """reads everything it is given (its inputs, the time, every view), then routes like shortest-queue"""

    def choose(self, i: int, t: float, insts) -> int:
        ints, floats = walk_numbers(insts, self.inputs, self.__dict__)
        SEEN.append((t, np.unique(ints[(ints >= BAND[0]) & (ints < BAND[1])]), np.unique(floats)))
        return min(range(len(insts)), key=lambda j: (insts[j].residents, j))


class OracleWalker(Walker):
    """the same walker, declared an oracle: it is handed the live instances"""

    oracle = True


class SnapshotWalker:
    """A TTFT estimator plug-in that reads everything in its snapshot."""

    def __init__(self, profile, params, pred_total, frontend_overhead_s):
        self.pred_total = pred_total

    def estimate(self, snap, q) -> float:
        ints, floats = walk_numbers(snap, q, self.pred_total)
        SEEN.append((q.t, np.unique(ints[(ints >= BAND[0]) & (ints < BAND[1])]), np.unique(floats)))
        return 0.01


class RaisesInInit(Router):
    """its constructor raises"""

    def __init__(self, inputs):
        raise RuntimeError("no config file for this router")


class RaisesInChoose(Router):
    """choose raises"""

    def choose(self, i: int, t: float, insts) -> int:
        return 1 // 0


class _Answers(Router):
    """answers ANSWER whatever it is asked"""

    ANSWER: object = 0

    def choose(self, i: int, t: float, insts):
        return self.ANSWER


class AnswersOutOfRange(_Answers):
    ANSWER = 99


class AnswersNegative(_Answers):
    ANSWER = -1


class AnswersNaN(_Answers):
    ANSWER = float("nan")


class AnswersFloat(_Answers):
    ANSWER = 1.0


class AnswersNone(_Answers):
    ANSWER = None


class AnswersBool(_Answers):
    ANSWER = True


class AnswersString(_Answers):
    ANSWER = "1"


NOT_A_ROUTER = 42


class EstimatorAnswers:
    """A TTFT estimator plug-in answering ANSWER (or raising it, if an exception)."""

    ANSWER: object = 0.1

    def __init__(self, profile, params, pred_total, frontend_overhead_s):
        pass

    def estimate(self, snap, q):
        if isinstance(self.ANSWER, BaseException):
            raise self.ANSWER
        return self.ANSWER


class EstimatorRaises(EstimatorAnswers):
    ANSWER = KeyError("F_TARGET")


class EstimatorNaN(EstimatorAnswers):
    ANSWER = float("nan")


class EstimatorNegative(EstimatorAnswers):
    ANSWER = -0.5


class EstimatorInfinite(EstimatorAnswers):
    ANSWER = float("inf")


class EstimatorArray(EstimatorAnswers):
    ANSWER = np.array([0.1, 0.2])


class EstimatorRaisesInInit(EstimatorAnswers):
    def __init__(self, profile, params, pred_total, frontend_overhead_s):
        raise ValueError("needs a GPU")


class SwallowsCtrlC(Router):
    """Ctrl-C arrives (sent to itself) inside a library that swallows the
    KeyboardInterrupt and then fails on what it left undone, as llvmlite's
    ctypes callback and Numba's ``no compiled object yet`` do."""

    summary = "Ctrl-C swallowed, then an error"

    def choose(self, i: int, t: float, insts) -> int:
        import os
        import signal

        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10**7):  # the handler runs between bytecodes
                pass
        except KeyboardInterrupt:
            pass
        raise RuntimeError("no compiled object yet")


PROCESS_WALK_LIMIT = 5_000  # objects per decision (enough to reach the twin's loop from the nearest frames)
FRAMES = 8  # callers' frames a ProcessWalker reads (beyond them: the test runner's, with everything in them)


ARRAY_LIMIT = 1 << 24  # elements of one array read by the shallow pass (the twin's arrays are far smaller)


def every_object_in_band() -> np.ndarray:
    """The band's ints held by any object the process's collector tracks (``gc.get_objects()``: every
    list, tuple, dict and instance), one level deep, NumPy arrays they hold included: a shallow pass
    over the whole process rather than a deep walk from a few roots."""
    import gc

    out: list = []
    for o in gc.get_objects():
        if o is out or str(getattr(type(o), "__module__", "")).startswith("numba"):  # (not the pass's own list)
            continue
        items = o.values() if isinstance(o, dict) else o if isinstance(o, list | tuple) else ()
        for x in items:
            if isinstance(x, np.ndarray) and x.dtype.kind in "iu" and 0 < x.size <= ARRAY_LIMIT and 0 not in x.strides:
                v = x.ravel().astype(np.int64)  # (a broadcast view, stride 0, would materialise: skipped)
                out.append(v[(v >= BAND[0]) & (v < BAND[1])])
            elif type(x) is int and BAND[0] <= x < BAND[1]:
                out.append(np.array([x], dtype=np.int64))
    return np.unique(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


class ProcessWalker(Router):
    """reads beyond what it is given, as Python lets any in-process code: the caller's frames (their
    locals), what refers to its views (``gc.get_referrers``) and every object the collector tracks
    (``gc.get_objects``); appends the band's ints it reached, one line per decision, to the file
    ``$LATROUTE_TEST_WALK_OUT`` (it may run in another process)"""

    def choose(self, i: int, t: float, insts) -> int:
        import gc
        import os
        import sys

        roots, f = [], sys._getframe(1)
        while f is not None and len(roots) < FRAMES:  # the nearest callers: the twin's loop is among them
            roots.append(dict(f.f_locals))
            f = f.f_back
        roots.extend(r for r in gc.get_referrers(insts) if isinstance(r, dict | list | tuple))
        ints, _ = walk_numbers(*reversed(roots), limit=PROCESS_WALK_LIMIT, skip_numba=True)  # the nearest frame first
        found = np.union1d(ints[(ints >= BAND[0]) & (ints < BAND[1])], every_object_in_band())
        with open(os.environ["LATROUTE_TEST_WALK_OUT"], "a") as fh:
            fh.write(" ".join(map(str, found.tolist())) + "\n")
        return min(range(len(insts)), key=lambda j: (insts[j].residents, j))


class SleepsInChoose(Router):
    """takes a minute to choose"""

    def choose(self, i: int, t: float, insts) -> int:
        import time

        time.sleep(60)
        return 0


class ExitsInChoose(Router):
    """ends its own process"""

    def choose(self, i: int, t: float, insts) -> int:
        import os

        os._exit(3)


class PromptTimesMs:
    """A plug-in TTFT estimator that needs no baseline parameters: a millisecond per prompt token,
    scaled by the host speed."""

    def __init__(self, profile, params, pred_total, frontend_overhead_s):
        self.speed = 1.0

    def estimate(self, snap, q) -> float:
        return 1e-3 * q.prompt * self.speed


