"""Command lines of the studies run as ``python -m harness.studies.NAME``: bad arguments answered
as latroute answers them (one line ``error: PROG: ...``, exit 2), not with argparse's usage
block or a Python traceback.

``StudyParser`` is argparse with that error line; ``number`` and ``count`` are argument types
with the ranges latroute's own options take (``harness.cli.params``: NaN, infinities and
overflow refused; studies may not import the CLI, which imports them); ``run_study`` calls a study's
``main`` and turns the refusals of its inputs (``BadInput``, a missing file, a value the
study's code refuses) into that line.
"""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from traces.errors import BadInput

MAX_MAGNITUDE = 1e9  # harness.cli.params.MAX_MAGNITUDE: rates, seconds
MIN_MAGNITUDE = 1e-3  # harness.cli.params.MIN_MAGNITUDE
MAX_SEED = 2**32 - 1


class StudyParser(argparse.ArgumentParser):
    """argparse whose refusal is one line and exit status 2."""

    def error(self, message: str):
        one_line(self.prog, message)


def one_line(prog: str, message: str):
    """Print ``error: PROG: message`` on one line and exit 2."""
    text = " ".join(str(message).split())
    print(f"error: {prog}: {text}", file=sys.stderr)
    raise SystemExit(2)


def number(lo: float = MIN_MAGNITUDE, hi: float = MAX_MAGNITUDE) -> Callable[[str], float]:
    """A finite number in [lo, hi]."""
    def parse(text: str) -> float:
        try:
            x = float(text) if len(text) <= 64 else math.nan
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and lo <= x <= hi):
            raise argparse.ArgumentTypeError(f"must be a finite number in [{lo:g}, {hi:g}] (got {text[:40]!r})")
        return x
    parse.__name__ = "number"
    return parse


def count(lo: int = 1, hi: int = 10**6) -> Callable[[str], int]:
    """A whole number in [lo, hi], written as one (``1e3`` and ``2.0`` refused)."""
    def parse(text: str) -> int:
        digits = text.strip().lstrip("+-")
        n = int(text) if digits.isascii() and digits.isdigit() and len(digits) <= 20 else None
        if n is None or not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"must be a whole number in [{lo}, {hi}] (got {text[:40]!r})")
        return n
    parse.__name__ = "count"
    return parse


SEED = count(0, MAX_SEED)


def run_study(main: Callable[[], object], prog: str) -> int:
    """``main()``'s exit status; a refusal of its inputs as one line, exit 2."""
    try:
        code = main()
    except BadInput as e:
        one_line(prog, str(e))
    except (OSError, ValueError) as e:
        one_line(prog, f"{type(e).__name__}: {e}")
    return int(code or 0)
