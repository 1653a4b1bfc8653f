"""How sure a request-level fit is of each value, and which values the requests cannot identify.

Why: a fit's values are where a search stopped; a reader needs to know which of them the timings
pin down and which trade off or do nothing (the gap between steps under a device-bound load, the
constant against the per-decode cost at one load).

How: a bootstrap over requests. Each draw resamples every trace's timed requests with replacement
and refits. Refitting with the twin in the loop would cost a search per draw, so each draw refits
a local model of the twin instead: the log of every request's predicted TTFT and TPOT, linear in
the log of the values around the fit (central differences, ``JAC_STEP`` either way: two replays
per value). A draw minimises the fit's own loss (``fit.score``, on the drawn requests) over that
model, with the same ranges (``fit_bounds``) and each value kept within a factor ``MAX_MOVE`` of
the fit; a draw's values are the fit moved by as much as the draw's optimum lies from the local
model's optimum on all the requests (the two differ a little: the model is linear, the twin is
not). The interval of a value is the 2.5th to 97.5th percentile of its draws: the spread that
comes from which requests were logged, not from the twin's own error.

A value is *not identified* when moving it by ``JAC_STEP`` moves no prediction by more than
``MIN_EFFECT`` (it does nothing to the timings), or when its interval spans more than a factor
``WIDE`` (the requests leave it free, typically trading off against another value), or when the
candidates that predict the held-back requests about as well as the chosen one (within ``CLOSE``)
spread over more than that factor (the bootstrap is local: it cannot see another part of a valley,
the candidates' searches can); a value on a range's bound is *set by the bound*. The one-token decode step ``const + D`` is reported too: it
can be identified when its two parts are not.
"""
from __future__ import annotations

import numpy as np

from harness.requestlevel.simplex import nelder_mead

JAC_STEP = 0.1  # log units (about 10%) either way of the fit
MAX_MOVE = np.log(10.0)  # a draw keeps each value within a factor 10 of the fit
MIN_EFFECT = 1e-3  # largest change of a log prediction below which a value does nothing
WIDE = 2.0  # an interval spanning more than this factor leaves the value not identified
CLOSE = 0.25  # candidates whose held-back score is within this share of the best's predict about as well
DRAW_EVALS = 120


class DrawScore:
    """``fit.score`` of the linearised predictions on one draw's rows, vectorised (a draw's search
    evaluates it a hundred times): the same four terms, the TTFT quantiles interpolated as
    ``np.percentile`` does."""

    def __init__(self, logs: list, jac: list, targets: list, rows: list[np.ndarray], w: dict,
                 quantiles: tuple[int, ...]):
        self.w, self.parts = w, []
        for (lt, lp, le), (jt, jp, je), tg, r in zip(logs, jac, targets, rows):
            mt, mp, me = tg.ttft[r], tg.tpot[r], tg.e2e[r]
            pos = np.asarray(quantiles, dtype=np.float64) / 100 * (r.size - 1)
            lo = np.floor(pos).astype(np.int64)
            part = {"at": lt[r], "At": jt[r], "mt": np.log(mt), "lo": lo, "hi": np.minimum(lo + 1, r.size - 1),
                    "frac": pos - lo, "q": np.percentile(mt, quantiles)}
            okp = np.isfinite(mp) & (mp > 0) & np.isfinite(lp[r])
            if okp.any():
                part.update(ap=lp[r][okp], Ap=np.nan_to_num(jp[r][okp]), mp=np.log(mp[okp]),
                            mean_p=float(np.nanmean(mp)))
            oke = np.isfinite(me) & (me > 0) & np.isfinite(le[r])
            if oke.any() and (w.get("e2e_req") or w.get("e2e_mean")):
                part.update(ae=le[r][oke], Ae=np.nan_to_num(je[r][oke]), me=np.log(me[oke]), mean_e=float(me[oke].mean()))
            self.parts.append(part)

    def __call__(self, delta: np.ndarray) -> float:
        w, total = self.w, 0.0
        for p in self.parts:
            vt = p["at"] + p["At"] @ delta
            e = np.exp(np.sort(vt))
            q = e[p["lo"]] + (e[p["hi"]] - e[p["lo"]]) * p["frac"]
            total += w["ttft_q"] * float(np.mean(np.abs(np.log(q / p["q"]))))
            total += w["ttft_req"] * float(np.mean(np.abs(vt - p["mt"])))
            if w.get("ttft_mean"):
                total += w["ttft_mean"] * abs(float(np.log(np.mean(np.exp(vt)) / np.mean(np.exp(p["mt"])))))
            if "ae" in p:
                ve = p["ae"] + p["Ae"] @ delta
                total += w.get("e2e_req", 0.0) * float(np.mean(np.abs(ve - p["me"])))
                total += w.get("e2e_mean", 0.0) * abs(float(np.log(np.mean(np.exp(ve)) / p["mean_e"])))
            if "ap" in p:
                vp = p["ap"] + p["Ap"] @ delta
                total += w["tpot_req"] * float(np.mean(np.abs(vp - p["mp"])))
                total += w["tpot_mean"] * abs(float(np.log(np.mean(np.exp(vp)) / p["mean_p"])))
        return total


def _jacobian(ev, x: np.ndarray) -> tuple[list, list]:
    """Per trace: log TTFT and log TPOT predictions at the fit, and their derivatives by log value."""
    base = ev.preds(x)
    z0 = np.log(x)
    jt = [np.zeros((len(t), len(x))) for t, _, _ in base]
    jp = [np.zeros((len(p), len(x))) for _, p, _ in base]
    je = [np.zeros((len(e), len(x))) for _, _, e in base]
    for j in range(len(x)):
        up, down = z0.copy(), z0.copy()
        up[j] += JAC_STEP
        down[j] -= JAC_STEP
        pu, pd = ev.preds(np.exp(up)), ev.preds(np.exp(down))
        if pu is None or pd is None:
            continue
        for k in range(len(base)):
            with np.errstate(divide="ignore", invalid="ignore"):
                jt[k][:, j] = (np.log(pu[k][0]) - np.log(pd[k][0])) / (2 * JAC_STEP)
                jp[k][:, j] = (np.log(pu[k][1]) - np.log(pd[k][1])) / (2 * JAC_STEP)
                je[k][:, j] = (np.log(pu[k][2]) - np.log(pd[k][2])) / (2 * JAC_STEP)
    logs = [tuple(np.log(a) for a in b) for b in base]
    return logs, list(zip(jt, jp, je))


def uncertainty(ev, x: np.ndarray, cfg, names: tuple[str, ...],
                quantiles: tuple[int, ...]) -> tuple[dict, np.ndarray | None]:
    """The bootstrap intervals of ``x`` (values named ``names``; see the module docstring) and the draws
    themselves (one row of values each); ``ev`` is the fit's ``Evaluator``, ``quantiles`` the TTFT
    quantiles its loss compares."""
    if ev.preds(x) is None:
        return {"method": "not run: the fitted twin leaves a request without a first token"}, None
    z0 = np.log(x)
    logs, jac = _jacobian(ev, x)
    effect = np.zeros(len(x))
    for k, tg in enumerate(ev.targets):
        idx = tg.timed()
        for d in jac[k][:2]:
            rows = np.nan_to_num(np.abs(d[idx]), nan=0.0)
            if rows.size:
                effect = np.maximum(effect, JAC_STEP * rows.max(axis=0))

    def moved(delta: np.ndarray) -> tuple[np.ndarray, float]:
        """The draw's values (ranges applied, within MAX_MOVE) and the penalty for leaving them."""
        d = np.clip(delta, -MAX_MOVE, MAX_MOVE)
        v, pen = ev.point(z0 + d)
        return np.log(v) - z0, pen + float(np.abs(d - delta).sum())

    def refit(rows: list[np.ndarray]) -> np.ndarray:
        draw = DrawScore(logs, jac, ev.targets, rows, cfg.weights, quantiles)

        def f(delta: np.ndarray) -> float:
            d, pen = moved(delta)
            return draw(d) + pen

        delta, _, _ = nelder_mead(f, np.zeros(len(x)), step=0.1, max_evals=DRAW_EVALS, tol=1e-7)
        return moved(delta)[0]

    # the local model's own optimum on every request is not exactly the fit: each draw is taken as a move
    # from it, applied to the fit
    centre = refit([tg.timed() for tg in ev.targets])
    rng = np.random.default_rng(cfg.seed)
    draws = []
    for _ in range(cfg.bootstrap):
        move = refit([rng.choice(tg.timed(), size=tg.timed().size, replace=True) for tg in ev.targets]) - centre
        draws.append(ev.point(z0 + move)[0])
    d = np.array(draws)
    at_bound = ev.bounds.at_bound(x) if ev.bounds is not None else {}
    coefs = {}
    for j, name in enumerate(names):
        lo, hi = (float(v) for v in np.percentile(d[:, j], [2.5, 97.5]))
        if effect[j] < MIN_EFFECT:
            why, ok = f"no effect: +-{100 * (np.exp(JAC_STEP) - 1):.0f}% moves no prediction by {100 * MIN_EFFECT:.1f}%", False
        elif name in at_bound:
            why, ok = f"set by the {at_bound[name]}", False
        elif hi > WIDE * max(lo, 1e-300):
            why, ok = f"not identified: the interval spans a factor {hi / max(lo, 1e-300):.3g}", False
        else:
            why, ok = "identified", True
        coefs[name] = {"value": float(x[j]), "lo": lo, "hi": hi, "identified": ok, "why": why}
    step = d[:, 0] + d[:, 2]
    lo, hi = (float(v) for v in np.percentile(step, [2.5, 97.5]))
    derived = {"decode_step_s": {"value": float(x[0] + x[2]), "lo": lo, "hi": hi, "identified": hi <= WIDE * lo,
                                 "what": "const + D: a step decoding one token"}}
    return {"method": f"bootstrap over requests, {cfg.bootstrap} draws (seed {cfg.seed}), each refitted on the "
                      f"twin's predictions linearised around the fit (+-{JAC_STEP:g} in log value)",
            "draws": int(cfg.bootstrap), "coefficients": coefs, "derived": derived}, d


def with_candidates(u: dict, names: tuple[str, ...], values: list[np.ndarray], held: list[float]) -> dict:
    """``u`` with what the candidates say (``fit.Candidate``: values and held-back scores): the bootstrap is
    local, the candidates' searches end in different parts of a valley. Each value's range over the
    candidates whose held-back score is within ``CLOSE`` of the best is stored (``candidates``); a value they
    spread over more than a factor ``WIDE`` is not identified, whatever its interval."""
    if "coefficients" not in u or not values:
        return u
    best = min(held)
    near = np.array([v[:len(names)] for v, h in zip(values, held) if h <= best * (1 + CLOSE)])
    for j, name in enumerate(names):
        c = u["coefficients"][name]
        lo, hi = float(near[:, j].min()), float(near[:, j].max())
        c["candidates"] = [lo, hi]
        if c["identified"] and hi > WIDE * max(lo, 1e-300):
            c["identified"] = False
            c["why"] = (f"not identified: candidates that predict the held-back requests about as well (within "
                        f"{100 * CLOSE:.0f}%) range from {lo:.3g} to {hi:.3g}")
    step = near[:, 0] + near[:, 2]
    d = u["derived"]["decode_step_s"]
    d["candidates"] = [float(step.min()), float(step.max())]
    d["identified"] = bool(d["identified"] and step.max() <= WIDE * step.min())
    return u


def format_uncertainty(u: dict) -> list[str]:
    if "coefficients" not in u:
        return [f"intervals: {u['method']}"]
    lines = [f"95% intervals ({u['method']}):"]
    for name, c in list(u["coefficients"].items()) + [("const + D", u["derived"]["decode_step_s"])]:
        why = c.get("why", "identified" if c["identified"] else "not identified")
        lines.append(f"  {name:<20} {c['value']:.4g}  [{c['lo']:.4g}, {c['hi']:.4g}]  {why}")
    return lines
