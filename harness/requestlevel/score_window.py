"""The least a score window must hold (``validate`` and ``estimate --score-window``).

A window of a few requests scores nothing worth reading (a p99 of three
errors) and one of none ran NumPy's ``Mean of empty slice`` warnings on
to an internal ``IndexError``. The commands count the requests a window
scores from the trace's tables before any replay or estimate and refuse a
window holding fewer than ``MIN_SCORED``. Free of numpy: the options'
help states the minimum.
"""
from __future__ import annotations

from traces.errors import BadOption

MIN_SCORED = 20  # requests with a measured TTFT a score window must hold


def refuse_small_window(scored: int, of: int, window: tuple[float, float], what: str) -> None:
    """BadOption when ``scored`` (of ``of`` timed requests) is below ``MIN_SCORED``."""
    if scored < MIN_SCORED:
        raise BadOption("--score-window", f"{window[0]:g}:{window[1]:g} scores {scored} of the trace's {of} "
                                          f"requests with a measured TTFT ({what}); a score needs at least "
                                          f"{MIN_SCORED}: widen the window")
