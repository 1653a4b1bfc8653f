"""The LMBench H100 study: a fleet's request logs calibrated, validated and
scored with latroute's own commands, and the routing question they raise.

The data are llm-d-benchmark's LMBench runs of ``openshift/exp-3/H100``
(Llama-3.1-70B-Instruct, two replicas on H100-80GB) and ``openshift/exp-4``
(Llama-4-Scout FP8, TP 4), ``../shared/data/llmd_lmbench_per_request``
(its ``PROVENANCE.md``). Every number comes from a ``latroute`` command
this module runs in a child process (``trace import lmbench``,
``calibrate --from-requests``, ``validate``, ``estimate``, ``replay``),
reading the ``metrics.json`` each writes, so the page shows what a user
running those commands gets. Nothing is split or edited by hand.

Why child processes: each command is run exactly as its page line says,
with its own refusals (an incomplete run is imported only with
``--allow-incomplete``, which the table then says).

Groups (``GROUPS``): the vLLM round-robin deployment's ``sharegpt`` runs
(fitted on 4/8/12 q/s), its ``short_input`` runs (fitted on their own
0.5/1/1.5 q/s runs) and exp-4's vLLM runs (fitted on 4/8/12 q/s, no target).
The routing question compares the three exp-3 stacks on the requests all
three logged at each rate (LMBench launches prompt *i* at slot *i / qps*;
``common_slots``) with the twin's replay of
the same requests on the calibrated fleet under three routers.

The session-prefix question (``session_prefixes``): the ``short_input``
runs log sessions whose turns carry the conversation so far, so the
import derives prompt ``hash_ids`` from them; the twin replays each vLLM
run on the ``short_input`` fleet fit with prefix caching on, under
``shortest-queue``, ``prefix-affinity`` and ``sfs-cc``, with the derived
prefixes and without (``--no-session-prefix``), beside the measured llm-d
against vLLM difference at the same rate. ``--group short_input`` runs
that group and this question only.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

EXP3 = "exp-3/H100"
EXP4 = "exp-4"
VLLM_RR = "vllm-standalone-llama-3-70b-2replicas-H100"
LLMD = "llm-d-70b-2replicas-H100"
LLMD_RR = "llm-d-70b-2replicas-H100-no-router"
VLLM_EXP4 = "vllm-llama4-tp4"
ESTIMATORS = ("sfs", "throughput", "lps", "learned")
ROUTERS = ("round-robin", "prefix-affinity", "sfs-cc")
PREFIX_ROUTERS = ("shortest-queue", "prefix-affinity", "sfs-cc")  # the session-prefix question's routers
NO_PREFIX = "-no-prefix"  # suffix of a run's trace imported with --no-session-prefix


@dataclass(frozen=True)
class Group:
    """Runs of one deployment and workload, fitted on ``fit_qps`` and scored on the rest."""

    name: str
    experiment: str
    stack: str
    workload: str
    replicas: int
    fit_qps: tuple[float, ...]
    targets: bool  # whether the page's targets apply (exp-4: a table, no target)
    # engine settings the logs do not give, searched in calibration (``calibrate --search``): the KV cache
    # (TP and memory not recorded: the import's default never binds) and max_num_seqs (vLLM 0.8's H100
    # default of 1024 is far above what a 70B model's KV cache can hold)
    search: tuple[str, ...] = ("num_kv_blocks=3000,6000,12000,24000", "max_num_seqs=32,64,128,256")


GROUPS = (
    Group("sharegpt", EXP3, VLLM_RR, "sharegpt", 2, (4.0, 8.0, 12.0), True),
    Group("short_input", EXP3, VLLM_RR, "short_input", 2, (0.5, 1.0, 1.5), True),
    # the 4-12 q/s runs of exp-4 hardly load its engine (mean TTFT 41-54 ms): they cannot say its capacity, and a
    # search of it picks the grid's smallest values, which then queue every faster run; the import's settings kept
    Group("exp4", EXP4, VLLM_EXP4, "sharegpt", 1, (4.0, 8.0, 12.0), False, search=()),
)
TTFT_MEAN_TARGET, TTFT_P90_TARGET, SFS_MAPE_TARGET, LPS_MAPE_TARGET = 0.15, 0.20, 0.25, 1.00


class StudyError(RuntimeError):
    pass


def latroute(args: list, log: Path, ok_codes: tuple[int, ...] = (0,)) -> int:
    """One ``latroute`` command in a child process; its output appended to ``log``."""
    cmd = [sys.executable, "-m", "harness.cli", *map(str, args)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    with log.open("a") as f:
        f.write(f"$ latroute {' '.join(map(str, args))}\n{proc.stdout}{proc.stderr}"
                f"[exit {proc.returncode}, {time.perf_counter() - t:.1f} s]\n\n")
    if proc.returncode not in ok_codes:
        raise StudyError(f"latroute {' '.join(map(str, args[:3]))} ... exited {proc.returncode}: "
                         f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return proc.returncode


def runs_of(data: Path, experiment: str, stack: str, workload: str) -> pd.DataFrame:
    runs = pd.read_csv(data / "runs.csv")
    sel = runs[(runs["experiment"] == experiment) & (runs["stack"] == stack) & (runs["workload"] == workload)]
    return sel.sort_values("target_qps").reset_index(drop=True)


def read_metrics(d: Path) -> dict:
    return json.loads((d / "metrics.json").read_text())


def trace_dir(out: Path, run_id: str) -> Path:
    return out / "traces" / run_id


def import_run(data: Path, out: Path, run_id: str, log: Path, session_prefix: bool = True) -> dict:
    """``trace import lmbench`` of one run; an incomplete run (refused, exit 2) again with
    ``--allow-incomplete``. Returns the run's completeness as meta.json records it. Without
    ``session_prefix`` the run goes to ``traces/RUN-no-prefix``, imported with ``--no-session-prefix``."""
    d = trace_dir(out, run_id if session_prefix else f"{run_id}{NO_PREFIX}")
    if not (d / "meta.json").exists():
        base = ["trace", "import", "lmbench", data / "per_request.csv", "--run", run_id, "--out", d,
                *([] if session_prefix else ["--no-session-prefix"])]
        if latroute(base, log, ok_codes=(0, 2)) == 2:
            latroute([*base, "--allow-incomplete"], log)
    meta = json.loads((d / "meta.json").read_text())
    return meta.get("completeness") or {}


def ttft_errors(m: dict) -> dict:
    """The page's columns from a request-level ``validate``'s metrics.json."""
    dist = (m.get("ttft") or {}).get("distribution") or {}
    tpot = ((m.get("tpot") or {}).get("distribution") or {}).get("mean") or {}
    row = {f"ttft_{q}": (dist.get(q) or {}).get("error") for q in ("mean", "p50", "p90", "p99")}
    row["ttft_mean_s"] = (dist.get("mean") or {}).get("measured")
    row["tpot_mean"] = tpot.get("error")
    active = m.get("active_replicas") or {}
    row["replicas_implied"] = active.get("implied")
    row["partly_served"] = active.get("partly_served")
    spread = m.get("assign_seeds") or {}
    row["ttft_mean_seeds"] = spread.get("ttft_mean_error")
    row["ttft_p90_seeds"] = spread.get("ttft_p90_error")
    full = m.get("full_fleet") or {}
    if full:
        fd = (full.get("ttft") or {}).get("distribution") or {}
        row["full_fleet_ttft_mean"] = (fd.get("mean") or {}).get("error")
        row["full_fleet_ttft_p90"] = (fd.get("p90") or {}).get("error")
    return row


def study_group(g: Group, data: Path, out: Path, log: Path, seeds: int, echo: Callable[[str], None]) -> dict:
    """Import, fit on ``g.fit_qps``, validate and estimate every run of one group."""
    from traces.store import open_trace

    runs = runs_of(data, g.experiment, g.stack, g.workload)
    complete = {r.run_id: import_run(data, out, r.run_id, log) for r in runs.itertuples()}
    fit_ids = [r.run_id for r in runs.itertuples() if r.target_qps in g.fit_qps]
    prof = out / "profiles" / f"{g.name}.json"
    if not prof.exists():
        prof.parent.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        latroute(["calibrate", "--from-requests", *[trace_dir(out, r) for r in fit_ids], "--replicas", g.replicas,
                  *(["--assign", "round-robin", "--assign-seeds", seeds] if g.replicas > 1 else []),
                  *[a for kv in g.search for a in ("--search", kv)], "--frontend", "measured", "--out", prof], log)
        echo(f"{g.name}: calibrated on {', '.join(fit_ids)} in {time.perf_counter() - t:.0f} s")
    rows = []
    for r in runs.itertuples():
        v = out / "validate" / r.run_id
        if not (v / "metrics.json").exists():
            latroute(["validate", trace_dir(out, r.run_id), "--profile", prof, "--out", v, "--force"], log)
        vr = out / "validate-random" / r.run_id  # the deployment's routing unknown: a random split, its seeds' spread
        if g.replicas > 1 and not (vr / "metrics.json").exists():
            latroute(["validate", trace_dir(out, r.run_id), "--profile", prof, "--replicas", g.replicas,
                      "--assign", "random", "--assign-seeds", seeds, "--out", vr, "--force"], log)
        e = out / "estimate" / r.run_id
        if not (e / "metrics.json").exists():
            latroute(["estimate", trace_dir(out, r.run_id), "--profile", prof, "--estimators", ",".join(ESTIMATORS),
                      "--out", e, "--force"], log)
        est = read_metrics(e).get("estimators") or {}
        # what no estimator of the engine can explain: the MAPE of answering every request with its run's own
        # median TTFT (measured, so out of any estimator's reach) is the per-request spread around the typical
        ttft = open_trace(trace_dir(out, r.run_id)).read("requests")["ttft_s"].to_numpy(np.float64)
        ttft = ttft[np.isfinite(ttft) & (ttft > 0)]
        median_mape = float(np.mean(np.abs(np.median(ttft) - ttft) / ttft))
        c = complete[r.run_id]
        rows.append({"run": r.run_id, "qps": float(r.target_qps), "requests": int(r.n_requests),
                     "in_fit": r.run_id in fit_ids, "complete": c.get("status", "unknown"),
                     "missing": c.get("missing"), **ttft_errors(read_metrics(v)),
                     "random_ttft_mean_seeds": (ttft_errors(read_metrics(vr))["ttft_mean_seeds"]
                                                if g.replicas > 1 else None),
                     **{f"mape_{n}": (est.get(n) or {}).get("mape") for n in ESTIMATORS},
                     "median_ape_sfs": (est.get("sfs") or {}).get("median_ape"), "mape_run_median": median_mape})
        echo(f"{g.name} {r.run_id} {r.target_qps:g} q/s: TTFT mean {_pct(rows[-1]['ttft_mean'])}, "
             f"p90 {_pct(rows[-1]['ttft_p90'])}, SFS MAPE {_pct(rows[-1]['mape_sfs'], signed=False)}")
    fit_doc = json.loads(prof.read_text())
    return {"group": g.__dict__, "fit_runs": fit_ids, "profile": str(prof),
            "request_fit": {k: fit_doc["fitted_on"].get(k) for k in ("fleet", "engine", "requests")},
            "rows": rows}


def _pct(x, signed: bool = True) -> str:
    if x is None or not np.isfinite(x):
        return "-"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def common_slots(data: Path, run_ids: list[str], qps: float) -> dict[str, np.ndarray]:
    """Per run, a key of each logged request, in the imported trace's request order: its launch slot
    (LMBench launches prompt *i* of its file at *i / qps*: the nearest slot) and its prompt length.
    Keys every run logged are the comparison's requests. The prompt length checks the slot: where a
    client fell behind its grid (launches straying near half a slot) a request put in a neighbour's slot
    carries another prompt and matches nothing, so it drops out rather than pairing wrongly."""
    from traces.store import open_trace

    out = {}
    for rid in run_ids:
        reqs = open_trace(trace_dir(data, rid)).read("requests")
        arr = reqs["arrival_s"].to_numpy(np.float64)
        slot = np.rint((arr - arr.min()) * qps).astype(np.int64)
        out[rid] = slot * 1_000_000 + reqs["prompt_tokens"].to_numpy(np.int64)
    return out


def routing_pool(out: Path, profile: Path, replicas: int, caching: bool | None = None,
                 name: str = "fleet-pool.json") -> Path:
    """The calibrated fleet as a pool file: each replica names the fitted profile (its engine and
    front-end overhead travel with it; the twin's replay has no serial front-end queue). ``caching``
    states prefix caching on every replica (None: the profile's fitted engine decides)."""
    extra = {} if caching is None else {"prefix_caching": caching}
    pool = {"name": "lmbench-h100-fleet",
            "instances": [{"instance_id": f"replica-{k}", "model": "llama-3.1-70b", "profile": str(profile),
                           "frontend": "overhead", **extra} for k in range(replicas)]}
    path = out / "profiles" / name
    path.write_text(json.dumps(pool, indent=1) + "\n")
    return path


def routing_question(data: Path, out: Path, log: Path, profile: Path, seeds: int,
                     echo: Callable[[str], None]) -> list[dict]:
    """Measured TTFT of the three exp-3 stacks on the requests all three logged, per rate, beside
    the twin's replay of the vLLM run's arrivals on the calibrated fleet under ``ROUTERS``."""
    stacks = {name: runs_of(data, EXP3, stack, "sharegpt") for name, stack in
              (("vllm-rr", VLLM_RR), ("llm-d", LLMD), ("llm-d-rr", LLMD_RR))}
    pool = routing_pool(out, profile, 2)
    rows = []
    for q in sorted(set(stacks["vllm-rr"]["target_qps"])):
        ids = {name: df.loc[df["target_qps"] == q, "run_id"].iloc[0] for name, df in stacks.items()}
        for rid in ids.values():
            import_run(data, out, rid, log)
        slots = common_slots(out, list(ids.values()), q)
        shared = set.intersection(*(set(s.tolist()) for s in slots.values()))
        row = {"qps": q, "common": len(shared), **{f"logged_{n}": len(slots[r]) for n, r in ids.items()}}
        from traces.store import open_trace

        for name, rid in ids.items():
            ttft = open_trace(trace_dir(out, rid)).read("requests")["ttft_s"].to_numpy(np.float64)
            row[f"measured_{name}"] = float(ttft[np.isin(slots[rid], list(shared))].mean()) if shared else None
        vrun = ids["vllm-rr"]
        vmask = np.isin(slots[vrun], list(shared))
        for router in ROUTERS:
            got = []
            for seed in range(seeds if router != "round-robin" else 1):
                d = out / "routing" / f"{vrun}-{router}-s{seed}"
                if not (d / "metrics.json").exists():
                    latroute(["replay", "--pool", pool, "--trace", trace_dir(out, vrun), "--router", router,
                              "--seed", seed, "--out", d, "--force"], log)
                served = pd.read_parquet(d / "served" / "requests.parquet").sort_values("request_id")
                got.append(float(served["ttft_s"].to_numpy(np.float64)[vmask].mean()))
            row[f"twin_{router}"] = float(np.median(got))
        rows.append(row)
        echo(f"routing {q:g} q/s: {len(shared)} common requests; measured " + ", ".join(
            f"{n} {row[f'measured_{n}']:.2f} s" for n in ids if row[f"measured_{n}"] is not None))
    return rows


def session_prefixes(data: Path, out: Path, log: Path, profile: Path, echo: Callable[[str], None]) -> list[dict]:
    """The ``short_input`` runs' sessions: the measured llm-d (prefix- and load-aware router) against vLLM
    (round-robin) at each rate, beside the twin's replay of the vLLM run's arrivals on the calibrated fleet
    (prefix caching on, vLLM 0.8.5 V1's default) under ``PREFIX_ROUTERS``, with the prompt prefixes derived
    from the sessions (``traces.importers.session_prefix``) and without them (``--no-session-prefix``). One seed (0)
    for every replay, so that on against off and router against router are paired (same noise draws); the
    seeds' spread is not measured here."""
    from traces.store import open_trace

    vllm, llmd = (runs_of(data, EXP3, stack, "short_input") for stack in (VLLM_RR, LLMD))
    pool = routing_pool(out, profile, 2, caching=True, name="fleet-pool-prefix-caching.json")
    rows = []
    for q in sorted(set(vllm["target_qps"]) & set(llmd["target_qps"])):
        vid, lid = (df.loc[df["target_qps"] == q, "run_id"].iloc[0] for df in (vllm, llmd))
        for rid in (vid, lid):
            import_run(data, out, rid, log)
        import_run(data, out, vid, log, session_prefix=False)
        row: dict = {"qps": float(q), "vllm_run": vid, "llmd_run": lid}
        for name, rid in (("vllm", vid), ("llmd", lid)):
            ttft = open_trace(trace_dir(out, rid)).read("requests", ["ttft_s"])["ttft_s"].to_numpy(np.float64)
            row[f"logged_{name}"], row[f"measured_{name}"] = len(ttft), float(ttft.mean())
        sess = open_trace(trace_dir(out, vid)).meta.get("sessions") or {}
        row["shared_share"] = (sess["shared_prompt_tokens"] / sess["prompt_tokens"]
                               if sess.get("prompt_tokens") else None)
        for on, tdir in ((True, trace_dir(out, vid)), (False, trace_dir(out, f"{vid}{NO_PREFIX}"))):
            for router in PREFIX_ROUTERS:
                d = out / "prefixes" / f"{vid}-{router}-{'on' if on else 'off'}"
                if not (d / "metrics.json").exists():
                    latroute(["replay", "--pool", pool, "--trace", tdir, "--router", router, "--seed", 0,
                              "--out", d, "--force"], log)
                m = read_metrics(d)
                row[f"twin_{router}_{'on' if on else 'off'}"] = float(m["ttft_mean_s"])
                row[f"hit_{router}_{'on' if on else 'off'}"] = float(m.get("prefix_hit_rate") or 0.0)
        rows.append(row)
        echo(f"session prefixes {q:g} q/s: measured vLLM {row['measured_vllm']:.3f} s, llm-d "
             f"{row['measured_llmd']:.3f} s; twin " + ", ".join(
                 f"{r} {row[f'twin_{r}_on']:.3f}/{row[f'twin_{r}_off']:.3f} s" for r in PREFIX_ROUTERS))
    return rows


def prefix_table(rows: list[dict]) -> list[str]:
    head = " | ".join(f"twin {r}: prefixes on (hit) / off" for r in PREFIX_ROUTERS)
    lines = [f"| q/s | logged vLLM / llm-d | prompt tokens in an earlier prompt's blocks | measured vLLM rr | "
             f"llm-d | llm-d − vLLM | {head} |", "|" + "---|" * (6 + len(PREFIX_ROUTERS))]
    for r in rows:
        diff = r["measured_llmd"] - r["measured_vllm"]
        share = "-" if r["shared_share"] is None else f"{100 * r['shared_share']:.0f}%"
        lines.append(f"| {r['qps']:g} | {r['logged_vllm']} / {r['logged_llmd']} | {share} | "
                     f"{1e3 * r['measured_vllm']:.1f} ms | {1e3 * r['measured_llmd']:.1f} ms | "
                     f"{1e3 * diff:+.1f} ms ({100 * diff / r['measured_vllm']:+.0f}%) | " + " | ".join(
                         f"{1e3 * r[f'twin_{x}_on']:.1f} ({100 * r[f'hit_{x}_on']:.0f}%) / "
                         f"{1e3 * r[f'twin_{x}_off']:.1f} ms" for x in PREFIX_ROUTERS)
                     + " |")
    return lines


def _seeds(v) -> str:
    return "-" if not v else f"{100 * v[0]:+.0f}/{100 * v[1]:+.0f}/{100 * v[2]:+.0f}%"


def group_table(res: dict) -> list[str]:
    g = res["group"]
    lines = ["| run | q/s | logged | fitted on | TTFT mean (measured) | TTFT mean err | p50 | p90 | p99 | TPOT mean | "
             "replicas implied | mean err, random split: seeds min/med/max | full fleet mean / p90 err | "
             + " | ".join(f"MAPE {n}" for n in ESTIMATORS) + " | SFS median APE | MAPE of the run's own median |",
             "|" + "---|" * (15 + len(ESTIMATORS))]
    for r in res["rows"]:
        logged = f"{r['requests']}" + (f" ({r['missing']} missing)" if r.get("missing") else "")
        replicas = "-" if r["replicas_implied"] is None else (
            f"{r['replicas_implied']} of {g['replicas']}" + (" **partly served**" if r["partly_served"] else ""))
        full = ("-" if r.get("full_fleet_ttft_mean") is None else
                f"{_pct(r['full_fleet_ttft_mean'])} / {_pct(r['full_fleet_ttft_p90'])}")
        lines.append(f"| {r['run']} | {r['qps']:g} | {logged} | {'yes' if r['in_fit'] else ''} | "
                     f"{r['ttft_mean_s']:.3f} s | {_pct(r['ttft_mean'])} | {_pct(r['ttft_p50'])} | "
                     f"{_pct(r['ttft_p90'])} | {_pct(r['ttft_p99'])} | {_pct(r['tpot_mean'])} | {replicas} | "
                     f"{_seeds(r['random_ttft_mean_seeds'])} | {full} | "
                     + " | ".join(_pct(r[f"mape_{n}"], signed=False) for n in ESTIMATORS)
                     + f" | {_pct(r['median_ape_sfs'], signed=False)} | {_pct(r['mape_run_median'], signed=False)} |")
    return lines


def targets(res: dict) -> list[str]:
    """Which out-of-sample runs meet the page's targets, counted."""
    rows = [r for r in res["rows"] if not r["in_fit"] and r["complete"] != "incomplete"]
    low = [r for r in res["rows"] if r["qps"] <= max(res["group"]["fit_qps"])]

    def count(sel, key, bound):
        ok = [r for r in sel if r.get(key) is not None and abs(r[key]) <= bound]
        return f"{len(ok)} of {len(sel)}"

    return [f"- TTFT mean within {100 * TTFT_MEAN_TARGET:.0f}%: {count(rows, 'ttft_mean', TTFT_MEAN_TARGET)} "
            f"complete runs not fitted on",
            f"- TTFT p90 within {100 * TTFT_P90_TARGET:.0f}%: {count(rows, 'ttft_p90', TTFT_P90_TARGET)}",
            f"- SFS MAPE <= {100 * SFS_MAPE_TARGET:.0f}% at the fitted rates: {count(low, 'mape_sfs', SFS_MAPE_TARGET)}",
            f"- LPS MAPE <= {100 * LPS_MAPE_TARGET:.0f}%: {count(res['rows'], 'mape_lps', LPS_MAPE_TARGET)} runs"]


def routing_table(rows: list[dict]) -> list[str]:
    lines = ["| q/s | requests all three logged (vLLM / llm-d / llm-d no router) | measured vLLM rr | llm-d | "
             "llm-d rr | twin round-robin | twin prefix-affinity | twin sfs-cc |", "|" + "---|" * 8]
    for r in rows:
        lines.append(f"| {r['qps']:g} | {r['common']} ({r['logged_vllm-rr']} / {r['logged_llm-d']} / "
                     f"{r['logged_llm-d-rr']}) | "
                     + " | ".join("-" if r.get(k) is None else f"{r[k]:.2f} s" for k in
                                  ("measured_vllm-rr", "measured_llm-d", "measured_llm-d-rr",
                                   *(f"twin_{x}" for x in ROUTERS))) + " |")
    return lines


def study(data: Path, out: Path, seeds: int = 5, groups: tuple[str, ...] = (), routing: bool = True,
          echo: Callable[[str], None] = print) -> dict:
    """Run every group (or ``groups``) and the routing question; write results.json and tables.md."""
    out.mkdir(parents=True, exist_ok=True)
    log = out / "commands.log"
    results: dict = {"data": str(data), "seeds": seeds, "groups": {}}
    for g in GROUPS:
        if groups and g.name not in groups:
            continue
        results["groups"][g.name] = study_group(g, data, out, log, seeds, echo)
    if routing and "sharegpt" in results["groups"]:
        results["routing"] = routing_question(data, out, log, Path(results["groups"]["sharegpt"]["profile"]),
                                              seeds, echo)
    if "short_input" in results["groups"]:
        results["session_prefixes"] = session_prefixes(data, out, log, Path(results["groups"]["short_input"]["profile"]),
                                                       echo)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    md = []
    for name, res in results["groups"].items():
        md += [f"### {name}", "", *group_table(res), ""]
        if res["group"]["targets"]:
            md += [*targets(res), ""]
    if "routing" in results:
        md += ["### routing", "", *routing_table(results["routing"]), ""]
    if "session_prefixes" in results:
        md += ["### session prefixes", "", *prefix_table(results["session_prefixes"]), ""]
    (out / "tables.md").write_text("\n".join(md))
    echo(f"wrote {out / 'results.json'} and {out / 'tables.md'} (every command and its output: {log})")
    return results
