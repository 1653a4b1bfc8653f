"""Signals for the ``latroute`` program: SIGTERM unwinds like Ctrl-C.

Apart from the error path (``harness.cli``) because it is process-wide
state: a handler installed while a command runs and removed after it, and
one installed while the command line itself is importing (SIGTERM
killed a run without removing its temporaries, bench's synthetic CSV among
them; Ctrl-C in the first ~0.3 s printed a KeyboardInterrupt traceback).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable

EXIT_INTERRUPTED = 130

class Terminated(KeyboardInterrupt):
    """SIGTERM: unwinds like Ctrl-C, so every ``with`` writing an output
    removes its temporaries; the CLI then exits 143."""

    signum = signal.SIGTERM


def _signum(e: BaseException) -> int:
    """The signal behind an interruption: SIGTERM for any ``Terminated``
    (the CLI's, the sweep's, trace query's), SIGINT otherwise."""
    if getattr(e, "signum", None) == signal.SIGTERM or type(e).__name__ == "Terminated":
        return signal.SIGTERM
    return signal.SIGINT


def _early_interrupt(signum, frame) -> None:
    """Ctrl-C while the command line itself is still being imported: the
    one line and 130, not a KeyboardInterrupt traceback."""
    os.write(2, b"interrupted\n")
    os._exit(EXIT_INTERRUPTED)


def _run_as_program() -> bool:
    """Whether this import is the ``latroute`` program starting (console
    script or ``python -m harness.cli``), not a library or test import."""
    return os.path.basename(sys.argv[0] if sys.argv else "") in ("-m", "latroute")


if _run_as_program() and threading.current_thread() is threading.main_thread():
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _early_interrupt)
    except (ValueError, OSError):
        pass


_SEEN: list[int] = []


def _interrupt(signum, frame) -> None:
    """Ctrl-C while a command runs: noted, then raised as Python's own
    handler would. The note lets the error path tell an interruption that
    a library swallowed (a KeyboardInterrupt raised inside llvmlite's
    ctypes callback while Numba loads its cache is printed and dropped, and
    Numba then fails with ``no compiled object yet``) from a real error."""
    _SEEN.append(signum)
    raise KeyboardInterrupt


def _watch_sigint() -> Callable[[], None]:
    """While a command runs, Ctrl-C goes through ``_interrupt``; returns
    the undo. A background job's ignored SIGINT stays ignored."""
    _SEEN.clear()
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGINT) not in (_early_interrupt, signal.default_int_handler):
        return lambda: None
    signal.signal(signal.SIGINT, _interrupt)
    return lambda: signal.signal(signal.SIGINT, signal.default_int_handler)


def sigint_seen() -> bool:
    """Whether Ctrl-C came while the current command ran."""
    return bool(_SEEN)


def keep_exit_status() -> None:
    """Make the interpreter exit with the status the CLI chose.

    CPython 3.11 remembers, for good, any KeyboardInterrupt that passed
    through an ``exec`` of a string (scipy's array-API shim imports numpy
    that way, under Numba's first compile), even when latroute caught it,
    and then ends the process by SIGINT at exit (status -2, not 130). The
    flag is an exported global there; where it is not (other versions) the
    exit is made directly, after the exit handlers and a flush."""
    import ctypes

    try:
        ctypes.c_int.in_dll(ctypes.pythonapi, "_Py_UnhandledKeyboardInterrupt").value = 0
        return
    except (ValueError, AttributeError, OSError):
        pass
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(EXIT_INTERRUPTED)


def _terminate(signum, frame) -> None:
    raise Terminated()


def _handle_sigterm() -> Callable[[], None]:
    """Turn SIGTERM into ``Terminated`` while a command runs (main thread,
    and only where SIGTERM has its default action); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return lambda: None
        signal.signal(signal.SIGTERM, _terminate)
    except (ValueError, OSError):
        return lambda: None
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
