"""Request-level fits on the two real GPU runs, scored on time they were not fitted on
(``docs/results/gpu-fidelity.md``; ``latroute study gpu-fidelity``).

The question: fitted on the first 50% and on the first 30% of a run's timings (every request's
arrival and lengths replayed), does the twin predict the second half's TTFT mean, p50, p99, TPOT
mean and E2E mean within 3%? The procedure is chosen using the fit window only: every variant of
the fit is also run on the first two thirds of the window and scored on the window's last third
(the same five figures), and among the variants that keep the fit's rule (ranges and a held-back
choice; the others are ablations) the one with the smallest mean absolute error there is the one
the page reports; its second-half figures are shown, and every other variant's beside them.

Outputs in ``--out``: ``results.json`` (every fit's values, intervals, candidates and scores),
``tables.md`` (the page's tables) and the profiles (``profiles/RUN-WINDOW-VARIANT.json``).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RUNS = (("RTX 4090", "RTX4090_Llama-3.1-8B", "r4090"), ("PRO 6000", "RTXPRO6000_Qwen3-32B", "p6000"))
# Settings a run's meta.json lacks but its PROVENANCE.md states, given at import as a user would with
# ``trace import vllm-reqstats --engine KEY=VALUE``: the PRO 6000 run's meta.json has no hardware section,
# while the provenance table names its GPUs (2x RTX PRO 6000), which the weight-read floor needs.
STATED_AT_IMPORT = {"p6000": ("gpu=RTX PRO 6000",)}
WINDOWS = (0.5, 0.3)
SCORE_WINDOW = (0.5, 1.0)
TARGETS = (("ttft", "mean"), ("ttft", "p50"), ("ttft", "p99"), ("tpot", "mean"), ("e2e", "mean"))
TARGET_LABELS = ("TTFT mean", "TTFT p50", "TTFT p99", "TPOT mean", "E2E mean")
TOLERANCE = 0.03


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    overrides: tuple = ()  # RequestFitConfig fields replaced, as (name, value) pairs
    rule: bool = True  # keeps the fit's rule (ranges and a held-back choice): may be chosen; else an ablation

    def config(self) -> dict:
        return dict(self.overrides)


def _without_means():
    from harness.requestlevel.fit import WITHOUT_MEANS

    return (("weights", WITHOUT_MEANS),)


NO_MEANS = _without_means()
FIGURES = (("held_back_metric", "figures"),)
UNREFINED = (("refine_evals", 0),)
OFF = (("bounds", False),)
IN_WINDOW = (("held_back", 0.0),)
DEFAULT = "ranges + held-back choice"
VARIANTS = (
    Variant(DEFAULT, "the default: the values held to the ranges the requests support; among the candidates (one "
                     "search per start), the one whose loss on the window's held-back last third is lowest, refined "
                     "on all of it; the loss with its TTFT-mean and E2E-mean terms"),
    Variant("held-back figures", "as the default, the held-back part scored by the figures a run is judged by "
                                 "(TTFT mean, p50, p99, TPOT mean, E2E mean) instead of the loss", FIGURES),
    Variant("without the mean terms", "as the default, the loss without its TTFT-mean and E2E-mean terms", NO_MEANS),
    Variant("without the mean terms, held-back figures", "both of the two above", NO_MEANS + FIGURES),
    Variant("without the mean terms, not refined", "as the variant without the mean terms, the chosen candidate "
                                                   "kept as it is (not refined on the whole window)",
            NO_MEANS + UNREFINED),
    Variant("without the mean terms, held-back figures, not refined", "the same with held-back figures",
            NO_MEANS + FIGURES + UNREFINED),
    Variant("no ranges", "ablation: as the default without the ranges", OFF, rule=False),
    Variant("no ranges, without the mean terms", "ablation: without the ranges and the mean terms", OFF + NO_MEANS,
            rule=False),
    Variant("lowest in-window loss, without the mean terms", "ablation: the candidate with the lowest loss on the "
            "whole window kept (no held-back choice), the loss without its mean terms", IN_WINDOW + NO_MEANS,
            rule=False),
    Variant("neither", "ablation: no ranges, no held-back choice", OFF + IN_WINDOW, rule=False),
    Variant("neither, without the mean terms", "ablation: no ranges, no held-back choice, the loss without its mean "
            "terms (the search as it was, but for its starts and stopping)", OFF + IN_WINDOW + NO_MEANS, rule=False),
)


def import_runs(data: Path, work: Path, vllm_version: str | None = None) -> dict[str, Path]:
    """The two runs imported with ``trace import vllm-reqstats`` (into ``work``; reused when there);
    ``vllm_version``: replayed under that release's scheduling rules instead of the one the logs state
    (``--engine vllm_version=X``)."""
    from traces.importers import import_trace
    from traces.importers.common import ImportOptions

    out = {}
    for _, folder, short in RUNS:
        d = work / "traces" / short
        stated = STATED_AT_IMPORT.get(short, ()) + ((f"vllm_version={vllm_version}",) if vllm_version else ())
        if not (d / "meta.json").exists():
            import_trace("vllm-reqstats", data / folder, d, ImportOptions(engine=stated), force=True)
        out[short] = d
    return out


def replayed_version(trace: Path) -> str:
    """The vLLM release whose scheduling rules replay ``trace`` (its import's ``vllm_version``)."""
    meta = json.loads((trace / "meta.json").read_text())
    return str(((meta.get("engine") or {}).get("settings") or {}).get("vllm_version", "0.32.0"))


def fit(trace: Path, window: tuple[float, float], variant: Variant, out: Path, bootstrap: bool):
    """``calibrate --from-requests TRACE --fit-window A:B`` with the variant's search (quietly)."""
    from harness.requestlevel.fit import calibrate_from_requests

    overrides = {**variant.config(), **({} if bootstrap else {"bootstrap": 0})}
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    t = time.perf_counter()
    res = calibrate_from_requests([trace], out, out.stem, (), False, 120, lambda _: None, fit_window=window,
                                  fit_overrides=overrides)
    return res, time.perf_counter() - t


def targets(trace: Path, profile_path: Path, window: tuple[float, float]) -> dict:
    """The engine view's five figures (``harness.requestlevel.engine_view``) over the requests in
    ``window``, the twin replaying every request with the profile."""
    from estimators.timemodel.profile import load_profile

    return targets_of(trace, load_profile(profile_path), window)


def targets_of(trace: Path, prof, window: tuple[float, float]) -> dict:
    """``targets`` for a profile in hand."""
    from harness.requestlevel.engine_options import (
        frontend_of,
        frontend_overhead,
        request_engine,
        trace_engine,
        virtual_engines,
    )
    from harness.requestlevel.engine_view import engine_view
    from harness.requestlevel.validate import RequestTrace, validate_requests
    from traces.store import open_trace

    t = open_trace(trace)
    engine = request_engine(prof, {}, stated=trace_engine([t]))
    v = validate_requests(RequestTrace.of(t), prof, engine, frontend_overhead(prof), record_steps=True,
                          virtual_engines=virtual_engines(prof), frontend=frontend_of(prof), score_window=window)
    view = engine_view(t.read("requests"), v.per_request, v.twin, None)
    return {f"{k} {q}": {"measured": view[k][q]["measured"], "twin": view[k][q]["twin"],
                         "error": view[k][q]["error"]} for k, q in TARGETS}


def figure_intervals(trace: Path, profile_path: Path, draws: np.ndarray, window: tuple[float, float]) -> dict:
    """Each figure's 2.5th-97.5th percentile over the fit's bootstrap draws (``RequestFit.draws``), each
    draw's values replayed as the profile: how far the fit window alone pins the figure down."""
    from estimators.timemodel.profile import load_profile
    from harness.requestlevel.fit import profile_of

    base = load_profile(profile_path)
    errs: dict[str, list[float]] = {}
    for values in draws:
        prof = load_profile(profile_path)
        prof.coefficients = profile_of(values, base.name).coefficients
        prof.fitted_on["request_fit"]["frontend_overhead_s"] = float(values[4])
        for k, v in targets_of(trace, prof, window).items():
            errs.setdefault(k, []).append(v["error"])
    return {k: [float(np.percentile(e, 2.5)), float(np.percentile(e, 97.5))] for k, e in errs.items()}


def _abs_errors(t: dict) -> list[float]:
    return [abs(t[f"{k} {q}"]["error"]) for k, q in TARGETS]


def fit_and_score(var: Variant, label: str, short: str, w: float, trace: Path, out: Path) -> tuple:
    """One variant on one run and window: the fit-window score (fitted on the window's first two thirds,
    scored on its last third) and the second half's figures of the fit on the whole window. Returns the
    row of results.json, the bootstrap draws (for the chosen variant's intervals) and the line to print."""
    from harness.requestlevel.fit import HELD_BACK

    key = f"{short}-{int(round(100 * w))}"
    cut = w * (1 - HELD_BACK)
    inner = out / "profiles" / f"{key}-inner-{_slug(var.name)}.json"
    fit(trace, (0.0, cut), var, inner, bootstrap=False)
    held = targets(trace, inner, (cut, w))
    path = out / "profiles" / f"{key}-{_slug(var.name)}.json"
    res, wall = fit(trace, (0.0, w), var, path, bootstrap=True)
    second = targets(trace, path, SCORE_WINDOW)
    row = {"run": label, "window": w, "fit_window_score": held,
           "fit_window_mae": float(np.mean(_abs_errors(held))), "second_half": second,
           "within": int(sum(e <= TOLERANCE for e in _abs_errors(second))),
           "values": dict(zip(("const", "P", "D", "sum_ctx", "frontend_overhead_s"), map(float, res.values))),
           "uncertainty": res.uncertainty, "replays": res.evals, "wall_s": wall,
           "candidates": [c.to_json() for c in res.candidates], "chosen": res.chosen,
           "bounds": json.loads(path.read_text())["fitted_on"]["request_fit"]["bounds"]}
    line = (f"{var.name:<32} {label:<9} {int(100 * w)}%: fit-window MAE {100 * row['fit_window_mae']:.2f}%, "
            f"second half {row['within']}/5 within 3% "
            f"({', '.join(f'{100 * e:+.1f}%' for e in (second[f'{k} {q}']['error'] for k, q in TARGETS))}) "
            f"in {wall:.0f} s")
    return key, row, (trace, path, res.draws), line


def _fit_and_score(task: tuple) -> tuple:
    return fit_and_score(*task)


def study(data: Path, out: Path, variants: tuple[Variant, ...] = VARIANTS, echo=print, jobs: int = 1,
          vllm_version: str | None = None) -> dict:
    """Every variant on both runs and both windows (``fit_and_score``), ``jobs`` fits at a time (each in a
    process of its own; every fit is deterministic, so the results do not depend on ``jobs``), replayed
    under ``vllm_version``'s scheduling rules (None: the runs' own, as their logs state)."""
    traces = import_runs(data, out, vllm_version)
    (out / "profiles").mkdir(parents=True, exist_ok=True)
    results: dict = {"variants": {}, "score_window": list(SCORE_WINDOW), "windows": list(WINDOWS),
                     "vllm_version": {short: replayed_version(t) for short, t in traces.items()}}
    draws: dict[tuple[str, str], tuple[Path, Path, np.ndarray | None]] = {}
    tasks = [(var, label, short, w, traces[short], out) for var in variants for label, _, short in RUNS
             for w in WINDOWS]
    if jobs > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))
        answers = pool.map(_fit_and_score, tasks)
    else:
        pool, answers = None, map(_fit_and_score, tasks)
    rows: dict[str, dict] = {}
    for (var, *_), (key, row, drawn, line) in zip(tasks, answers):
        echo(line)
        rows.setdefault(var.name, {})[key] = row
        draws[var.name, key] = drawn
    if pool is not None:
        pool.shutdown()
    for var in variants:
        r = rows[var.name]
        results["variants"][var.name] = {"what": var.what, "overrides": var.config(), "rule": var.rule, "runs": r,
                                         "fit_window_mae": float(np.mean([x["fit_window_mae"] for x in r.values()]))}
    eligible = [k for k, v in results["variants"].items() if v["rule"]] or list(results["variants"])
    results["chosen"] = min(eligible, key=lambda k: results["variants"][k]["fit_window_mae"])
    for key, row in results["variants"][results["chosen"]]["runs"].items():
        trace, path, d = draws[results["chosen"], key]
        if d is not None:
            row["second_half_intervals"] = figure_intervals(trace, path, d, SCORE_WINDOW)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float))
    (out / "tables.md").write_text(tables(results))
    echo(f"chosen by the fit window: {results['chosen']}; wrote {out / 'results.json'} and {out / 'tables.md'}")
    return results


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name.lower()).strip("-")


def _pct(e: float) -> str:
    s = f"{100 * e:+.1f}%".replace("-", "−")
    return f"**{s}**" if abs(e) <= TOLERANCE else s


def tables(results: dict) -> str:
    """The page's tables: the chosen variant's second-half figures with the values' intervals; every
    variant's fit-window score and second-half count."""
    chosen = results["variants"][results["chosen"]]
    versions = sorted(set((results.get("vllm_version") or {}).values()))
    lines = [f"### Second half, the chosen procedure ({results['chosen']})", "",
             *([f"Replayed under vLLM {', '.join(versions)}'s scheduling rules.", ""] if versions else []),
             "| run | fit window | " + " | ".join(TARGET_LABELS) + " | within 3% |",
             "|---|---|" + "---:|" * (len(TARGETS) + 1)]
    for r in chosen["runs"].values():
        s, iv = r["second_half"], r.get("second_half_intervals") or {}
        lines.append(f"| {r['run']} | first {int(100 * r['window'])}% | "
                     + " | ".join(_pct(s[f"{k} {q}"]["error"]) + (_span(iv[f"{k} {q}"]) if f"{k} {q}" in iv else "")
                                  for k, q in TARGETS) + f" | {r['within']} of 5 |")
    lines += ["", "Error against measured; in brackets, the 2.5th to 97.5th percentile of the same figure over the "
              "fit's bootstrap draws (each draw's values replayed): how far the fit window pins it down. Bold: "
              "within 3%.",
              "", "### The fitted values and their 95% intervals (bootstrap over requests)", "",
              "| run | fit window | const (ms) | P (µs/token) | D (µs/token) | sum_ctx (ns/token) | front end (ms) "
              "| const + D (ms) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    scale = {"const": 1e3, "P": 1e6, "D": 1e6, "sum_ctx": 1e9, "frontend_overhead_s": 1e3}
    for r in chosen["runs"].values():
        u = r["uncertainty"] or {}
        cells = []
        for name, k in scale.items():
            c = (u.get("coefficients") or {}).get(name)
            cells.append(_interval(c, k) if c else f"{k * r['values'][name]:.3g}")
        cells.append(_interval(u["derived"]["decode_step_s"], 1e3) if u.get("derived") else "")
        lines.append(f"| {r['run']} | first {int(100 * r['window'])}% | " + " | ".join(cells) + " |")
    lines += ["", "Value [2.5th, 97.5th percentile of the bootstrap draws]; ‡: not identified (the interval spans "
              "more than a factor 2, or the candidates that predict the held-back requests about as well spread "
              "more than that; each value's reason and the candidates' range are in results.json).",
              "", "### Every variant tried: fit-window score and second half", "",
              "| variant | run | fit window | fit-window score (mean abs. error, last third of the window) | "
              "second half: " + ", ".join(TARGET_LABELS) + " | within 3% |", "|---|---|---|---:|---|---:|"]
    for name, v in results["variants"].items():
        label = name + ("" if v.get("rule", True) else " (ablation)") + (" ← chosen" if name == results["chosen"] else "")
        for r in v["runs"].values():
            s = r["second_half"]
            lines.append(f"| {label} | {r['run']} | first {int(100 * r['window'])}% | {100 * r['fit_window_mae']:.2f}% | "
                         + " / ".join(_pct(s[f"{k} {q}"]["error"]) for k, q in TARGETS) + f" | {r['within']} of 5 |")
        lines.append(f"| **{label}: mean fit-window score** | | | **{100 * v['fit_window_mae']:.2f}%** | | "
                     f"**{sum(r['within'] == len(TARGETS) for r in v['runs'].values())} of {len(v['runs'])} "
                     f"fits 5 of 5** |")
    lines += ["", "Variants: " + "; ".join(f"*{n}*: {v['what']}" for n, v in results["variants"].items()) + "."]
    return "\n".join(lines) + "\n"


def _span(iv: list[float]) -> str:
    return f" [{100 * iv[0]:+.1f}, {100 * iv[1]:+.1f}]".replace("-", "−")


def _interval(c: dict, k: float) -> str:
    mark = "" if c["identified"] else " ‡"
    return f"{k * c['value']:.3g} [{k * c['lo']:.3g}, {k * c['hi']:.3g}]{mark}"


def main(data: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    return study(data, out)
