"""``--score-window``'s minimum (``harness.requestlevel.score_window``), stated in the help, and
``estimate``'s count of the requests its window scores."""
from __future__ import annotations

from harness.requestlevel.score_window import MIN_SCORED, refuse_small_window

WINDOW_HELP = f"; the window must hold at least {MIN_SCORED} requests with a measured TTFT"


def check_step_window(trace, window: tuple[float, float] | None) -> None:
    """``estimate``: the requests whose arrival falls in each instance's share of steps
    (``estimators.estimate.score_span``) and that have a measured TTFT."""
    if window is None:
        return
    import numpy as np

    from estimators.estimate import score_span

    steps = trace.read("steps", columns=["instance_id", "step", "start_s", "end_s"])
    reqs = trace.read("requests", columns=["instance_id", "arrival_s", "ttft_s"])
    ttft = reqs["ttft_s"].to_numpy(dtype=np.float64)
    timed = np.isfinite(ttft) & (ttft > 0)
    arrival = reqs["arrival_s"].to_numpy(dtype=np.float64)
    inst = reqs["instance_id"].to_numpy()
    scored = 0
    for name, g in steps.sort_values(["instance_id", "step"]).groupby("instance_id", sort=False):
        lo, hi = score_span(g["start_s"].to_numpy(), g["end_s"].to_numpy(), window)
        scored += int((timed & (inst == name) & (arrival >= lo) & (arrival < hi)).sum())
    refuse_small_window(scored, int(timed.sum()), window, "arriving within that share of each instance's steps")
