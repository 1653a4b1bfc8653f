"""The report's tables, as data (head, rows) with an optional note under
each: estimator and router metrics, vLLM-style serving metrics and the
run's parameters; and the same table as Markdown or HTML.

The serving table keeps to a 1400 px window: one column per latency, each
cell "mean / p50 / p90 / p99" (the stats named once, in the note), and no
ITL column when no run recorded token times (the note says why).
The parameter table is written for people: nested settings become one row
each, a policy is its sentence, lists and flags are plain words.
"""
from __future__ import annotations

import html

from reports.results import Result
from reports.serving import slo_goodput
from reports.sweep_cells import delta_routers, sweep_cells

ITL_NOTE = ("ITL needs token times, which only runs with steps record: validate, replay --record-steps; "
            "sweeps and other replays have none")


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v, fmt="{:.4f}") -> str:
    return "-" if v is None or v != v else fmt.format(v)


def estimator_table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    head = ["result", "estimator", "n", "MAPE", "median APE", "p90 APE", "p99 APE", "median µs"]
    rows = []
    for r in results:
        if r.kind == "estimate":
            for name, s in r.metrics["estimators"].items():
                rows.append([r.label, name, str(s.get("n")), _pct(s.get("mape")), _pct(s.get("median_ape")),
                             _pct(s.get("p90_ape")), _pct(s.get("p99_ape")), _num(s.get("median_us"), "{:.1f}")])
        elif r.kind == "validate":
            t = r.metrics["ttft"]
            rows.append([r.label, "twin replay", str(t.get("n")), _pct(t.get("mape")), _pct(t.get("median_ape")),
                         _pct(t.get("p90_ape")), _pct(t.get("p99_ape")), "-"])
    return head, rows


def _quality_policy(r: Result) -> str | None:
    return ((r.metrics.get("policies") or {}).get("quality") or {}).get("policy")


def no_accuracy(results: list[Result]) -> list[Result]:
    """The replays and sweeps that ran without accuracy (quality none)."""
    return [r for r in results if r.kind in ("replay", "sweep") and _quality_policy(r) == "none"]


def router_note(results: list[Result]) -> str:
    """One line when routers ran without accuracy: what OnTimeUtility then means."""
    none = no_accuracy(results)
    if not none:
        return ""
    return (f"No quality table ({', '.join(r.label for r in none)}): every model's accuracy is 1, so the utility "
            "is 1 - lambda * cost and OnTimeUtility is the on-time share less its cost; SLO attainment and SLO "
            "goodput (requests within their SLO per second) lead.")


def router_table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """One row per replay and per sweep cell (router, delta, lambda). Sweep
    rows give the AUC over rates when there are several rates, else the
    value at the one rate, and SLO attainment and TTFT at the highest rate.
    When every router result ran without accuracy (``no_accuracy``), SLO
    attainment and SLO goodput lead and OnTimeUtility follows."""
    head = ["result", "router", "OnTimeUtility (AUC for sweeps over rates)", "vs best baseline",
            "SLO attainment", "mean TTFT (s)", "p90 TTFT (s)", "rate (q/s)"]
    rows, goodput = [], []
    for r in results:
        if r.kind == "sweep":
            cells = sweep_cells(r) if "results" in r.tables else None
            for key, v in r.metrics.get("routers", {}).items():
                by_rate = v.get("by_rate", {})
                top = max(by_rate, key=float) if by_rate else None
                at_top = by_rate.get(top, {}) if top else {}
                util = v.get("auc_ontime_utility")
                if util is None and len(by_rate) == 1:
                    util = at_top.get("ontime_utility")
                p90 = good = None
                if cells is not None and top is not None:
                    c = cells[(cells["router"] == v["router"]) & (cells["rate"] == float(top))
                              & ((cells["delta_per_us"] - v.get("delta_per_us", 0.0)).abs() < 1e-15)]
                    if v.get("lambda") is not None and c["lam"].notna().any():
                        c = c[(c["lam"] - v["lambda"]).abs() < 1e-12]
                    p90 = float(c["ttft_p90_s"].iloc[0]) if len(c) and "ttft_p90_s" in c else None
                    good = float(c["slo_goodput"].iloc[0]) if len(c) and "slo_goodput" in c else None
                rows.append([r.label, key, _num(util), _num(v.get("auc_ratio_to_best_baseline"), "{:.3f}"),
                             _pct(at_top.get("slo_attainment")), _num(at_top.get("ttft_mean_s"), "{:.3f}"),
                             _num(p90, "{:.3f}"), top if top is not None else "-"])
                goodput.append(good)
        elif r.kind == "replay":
            m = r.metrics
            rows.append([r.label, m.get("router", "?"), _num(m["ontime_utility"]), "-", _pct(m["slo_attainment"]),
                         _num(m["ttft_mean_s"], "{:.3f}"), _num(m["ttft_p90_s"], "{:.3f}"),
                         _num(m.get("rate", (m.get("workload") if isinstance(m.get("workload"), dict) else {})
                                    .get("rate")), "{:g}")])
            duration = (m.get("serving") or {}).get("duration_s")
            goodput.append(None if duration is None else
                           slo_goodput(round(m["slo_attainment"] * m["requests"]), duration))
    routed = [r for r in results if r.kind in ("replay", "sweep")]
    if routed and len(no_accuracy(results)) == len(routed):  # SLO attainment, SLO goodput, then the rest
        head = head[:2] + ["SLO attainment (highest rate)", "SLO goodput (req/s)"] + head[2:4] + head[5:]
        rows = [row[:2] + [row[4], _num(g, "{:.2f}")] + row[2:4] + row[5:] for row, g in zip(rows, goodput)]
    return head, rows


def _serving_entries(results: list[Result]) -> tuple[list[tuple[str, str, dict]], list[float]]:
    """(result label, run, serving metrics) of replays, validate runs
    (recorded and twin) and sweep cells at their highest rate, and the
    percentiles they hold."""
    entries = []
    for r in results:
        if r.kind == "replay" and r.metrics.get("serving"):
            entries.append((r.label, r.metrics.get("router", "?"), r.metrics["serving"]))
        elif r.kind == "validate" and r.metrics.get("serving"):
            entries += [(r.label, k, s) for k, s in r.metrics["serving"].items()]
        elif r.kind == "sweep" and "results" in r.tables:
            df = r.tables["results"]
            cols = [c for c in df.columns if c.startswith("serve_")]
            if not cols:
                continue
            top = df[df["rate"] == df["rate"].max()].groupby(["router", "delta_per_us"])[cols].mean()
            for (router, delta), row in top.iterrows():
                s: dict = {}
                for c, v in row.items():
                    metric, _, stat = c[6:].partition("__")
                    if metric.endswith("_ms"):
                        s.setdefault(metric, {})[stat] = v
                    else:
                        s[metric] = v
                s["goodput"] = {"request_goodput": s.pop("request_goodput")} if "request_goodput" in s else None
                label = router + (f" δ={delta:g}" if router in delta_routers(r) else "")
                entries.append((r.label, f"{label} @ {df['rate'].max():g} q/s", s))
    pcts = sorted({float(k[1:]) for _, _, s in entries for k in (s.get("ttft_ms") or {}) if k.startswith("p")})
    return entries, pcts


def serving_table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """vLLM-style serving metrics (ms; req/s and tok/s): one column per
    latency, each cell mean / p50 / p90 / p99 (``serving_note`` says so);
    ITL and goodput only when a run has them."""
    entries, pcts = _serving_entries(results)
    with_itl = any(s.get("itl_ms") for _, _, s in entries)
    with_goodput = any((s.get("goodput") or {}).get("request_goodput") is not None for _, _, s in entries)
    latencies = [m for m in ("ttft", "tpot", "itl", "e2el") if m != "itl" or with_itl]
    head = (["result", "run"] + [f"{m.upper()} (ms)" for m in latencies] + ["req/s", "output tok/s"]
            + (["goodput req/s"] if with_goodput else []))
    rows = []
    for label, run, s in entries:
        row = [label, run]
        for m in latencies:
            st = s.get(f"{m}_ms") or {}
            vals = [st.get("mean")] + [st.get(f"p{p:g}") for p in pcts]
            row.append("-" if all(v is None for v in vals) else " / ".join(_num(v, "{:.1f}") for v in vals))
        row += [_num(s.get("request_throughput"), "{:.2f}"), _num(s.get("output_throughput"), "{:,.0f}")]
        if with_goodput:
            row.append(_num((s.get("goodput") or {}).get("request_goodput"), "{:.2f}"))
        rows.append(row)
    return head, rows


def serving_note(results: list[Result]) -> str:
    """What the serving table's cells hold, and why ITL is absent or '-'."""
    entries, pcts = _serving_entries(results)
    if not entries:
        return ""
    note = "Each latency cell: mean / " + " / ".join(f"p{p:g}" for p in pcts) + " (ms)."
    with_itl = [bool(s.get("itl_ms")) for _, _, s in entries]
    if not any(with_itl):
        note += f" No ITL column: no run here recorded token times ({ITL_NOTE})."
    elif not all(with_itl):
        note += f" ITL '-': that run recorded no token times ({ITL_NOTE})."
    if not any((s.get("goodput") or {}).get("request_goodput") is not None for _, _, s in entries):
        note += " No goodput column: no run was given --goodput bounds."
    return note


PARAMETERS = ("trace", "pool", "router", "lengths", "policies", "profile", "profiles", "arrival", "burst_ratio",
              "burstiness", "requests", "seeds", "rate_range", "lambda", "delta_per_us", "noise", "seed")


def plain(v) -> str:
    """A parameter's value in words: no JSON braces or quotes."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(plain(x) for x in v)
    if isinstance(v, dict):
        if "note" in v:  # a policy: its own sentence says what it is
            return str(v["note"])
        if set(v) == {"name", "form"}:
            return f"{v['name']} (form {v['form']})"
        return "; ".join(f"{k} {plain(x)}" for k, x in v.items())
    return str(v)


def params_table(results: list[Result]) -> tuple[list[str], list[list[str]]]:
    """One row per setting of each result; a nested setting (policies,
    per-instance profiles) one row per entry, named "policies: lengths"."""
    rows = []
    for r in results:
        for k in PARAMETERS:
            if k not in r.metrics:
                continue
            v = r.metrics[k]
            if k == "rate_range" and isinstance(v, list) and len(v) == 2:
                rows.append([r.label, r.kind, "rates (q/s)", f"{plain(v[0])} to {plain(v[1])}"])
            elif isinstance(v, dict) and v and all(isinstance(x, dict) for x in v.values()):
                rows += [[r.label, r.kind, f"{k}: {name}", plain(x)] for name, x in v.items()]
            else:
                rows.append([r.label, r.kind, k, plain(v)])
    return ["result", "kind", "parameter", "value"], rows


def md_table(head, rows, note: str = "") -> str:
    if not rows:
        return "_none_\n"
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n" + (f"\n{note}\n" if note else "")


def html_table(head, rows, note: str = "") -> str:
    if not rows:
        return "<p><em>none</em></p>"
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return (f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"
            + (f'<p class="note">{html.escape(note)}</p>' if note else ""))


