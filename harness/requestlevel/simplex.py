"""Nelder-Mead, our own (numpy): scipy is not a dependency, and the
request-level fit's five- to seven-dimensional smooth-ish problem needs no
more than a simplex.

Its loss is a replay of discrete steps: flat in places and stepped, so the
simplex's own spread test (``tol``) is often met late or never, long after
the loss stopped falling. ``patience`` stops a search once that many
evaluations have passed without the best value falling by more than
``ftol`` of itself."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.3, max_evals: int = 200,
                tol: float = 1e-5, patience: int | None = None, ftol: float = 1e-3) -> tuple[np.ndarray, float, int]:
    """Minimise ``f`` from ``x0`` (standard reflection/expansion/contraction/
    shrink coefficients 1, 2, 0.5, 0.5). Returns (x, f(x), evaluations)."""
    n = len(x0)
    track = {"best": np.inf, "at": 0, "count": 0}
    inner = f

    def counted(x: np.ndarray) -> float:
        v = inner(x)
        track["count"] += 1
        if v < track["best"] - ftol * abs(track["best"]) or not np.isfinite(track["best"]):
            track["at"] = track["count"]
        track["best"] = min(track["best"], v)
        return v

    def stalled() -> bool:
        return patience is not None and track["count"] - track["at"] >= patience

    f = counted
    pts = [np.asarray(x0, dtype=np.float64)]
    for i in range(n):
        x = pts[0].copy()
        x[i] += step
        pts.append(x)
    vals = [f(p) for p in pts]
    evals = n + 1
    while evals < max_evals and not stalled():
        order = np.argsort(vals)
        pts, vals = [pts[i] for i in order], [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) <= tol * (abs(vals[0]) + tol):
            break
        centroid = np.mean(pts[:-1], axis=0)
        xr = centroid + (centroid - pts[-1])
        fr = f(xr)
        evals += 1
        if fr < vals[0]:
            xe = centroid + 2.0 * (centroid - pts[-1])
            fe = f(xe)
            evals += 1
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (pts[-1] - centroid) if fr >= vals[-1] else centroid + 0.5 * (xr - centroid)
            fc = f(xc)
            evals += 1
            if fc < min(fr, vals[-1]):
                pts[-1], vals[-1] = xc, fc
            else:
                for i in range(1, n + 1):
                    pts[i] = pts[0] + 0.5 * (pts[i] - pts[0])
                    vals[i] = f(pts[i])
                evals += n
    best = int(np.argmin(vals))
    return pts[best], float(vals[best]), evals
