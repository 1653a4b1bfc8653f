"""The twin's reconstruction of the engine behind a request-level trace.

A request-level trace has no steps, so estimators cannot take honest
snapshots of it. The twin, replaying its arrivals with a calibrated
profile, produces the steps the engine would have run; we write them as a
trace whose ``requests`` table carries the MEASURED TTFT (``ttft_s``) and
end (``finish_s``) instead of the twin's (``validate`` compares the two).
Estimators then see reconstructed snapshots and are
scored against what was measured. The trace's meta says so
(``snapshots: reconstructed``).
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from estimators.baselines.params import throughput_params
from estimators.engine.config import InstanceConfig
from estimators.timemodel.calibrate import load_steps
from estimators.timemodel.profile import BatchTimeProfile, load_profile
from harness.requestlevel.cache import WARM_LEAD_S
from harness.requestlevel.frontend import FrontEnd
from harness.requestlevel.validate import RequestTrace, replay_requests
from harness.twin.simulation import write_twin_trace
from traces.store import TraceWriter

RECONSTRUCTED_NOTE = ("snapshots are RECONSTRUCTED: the trace has no engine steps, so the twin replayed its "
                      "arrivals with the calibrated profile and the estimators read the twin's states; "
                      "errors are against the measured TTFTs")


def write_reconstruction(rt: RequestTrace, profile: BatchTimeProfile, engine: InstanceConfig, overhead_s: float,
                         out: Path, source: str, virtual_engines: int = 1, frontend: FrontEnd | None = None) -> None:
    """The twin's replay as a trace with the measured TTFTs. A warm trace's
    warm-up rows come first (no measured TTFT: never scored) and its steps
    stay in the log, so a snapshot's cache holds every prompt as the engine's did."""
    res = replay_requests(rt, profile, engine, overhead_s, record_steps=True, virtual_engines=virtual_engines,
                          frontend=frontend)
    reqs = res.requests.copy()
    shift = res.extra["time_shift_s"]  # onto the log's clock
    reqs["ttft_s"] = rt.requests["ttft_s"].to_numpy(dtype=np.float64)
    reqs["finish_s"] = (rt.requests["finish_s"].to_numpy(dtype=np.float64) if "finish_s" in rt.requests
                        else np.full(len(reqs), np.nan))
    for col in ("arrival_s", "added_s", "finish_s"):
        reqs[col] = reqs[col] + shift
    warm = res.extra["warmup"].copy()
    warm["ttft_s"] = np.nan
    warm["finish_s"] = np.nan
    with TraceWriter(out) as w:
        w.meta["source"] = {"kind": "twin-reconstruction", "replay_of": source, "profile": profile.name}
        w.meta["arrivals"] = "measured"
        w.meta["snapshots"] = "reconstructed"
        w.meta["frontend_overhead_s"] = overhead_s
        w.meta["frontend"] = (frontend or FrontEnd()).to_json()
        if len(warm):
            w.meta["hash_block_tokens"] = int(engine.block_size)
            w.meta["warm_prefix"] = {"hits": "engine cache", "warmup_requests": int(len(warm)), "lead_s": WARM_LEAD_S}
        elif res.extra["warm_hits"]:
            w.meta["warm_prefix"] = {"hits": "given outright: the prompts do not fit in the KV cache together, so "
                                             "the reconstructed engine holds no cache for estimators to read"}
        write_twin_trace(w, res, pd.concat([warm, reqs], ignore_index=True) if len(warm) else reqs)


def baseline_params(rts: list[RequestTrace], profile: BatchTimeProfile, engine: InstanceConfig,
                    overhead_s: float, virtual_engines: int = 1, frontend: FrontEnd | None = None) -> dict:
    """The baseline estimators' parameters (``profile.derived``) from the
    twin's reconstructions of the calibration traces: throughput and decode
    step from the reconstructed steps, LPS and the queue fit from those
    steps with the measured TTFTs. A warm trace's warm-up (before its first
    arrival) is left out of all of them. A fleet's replicas replay one
    engine: the parameters are its first replica's."""
    from estimators.baselines.params import lps_params, pooled_lps, request_params
    from traces.store import open_trace

    # the baselines read snapshots rebuilt by walking the step log in synchronous order
    # (``estimators.snapshot``): an async engine's log (two batches in flight, outputs a step late) is not
    # one such a walk can follow, so their parameters come from the synchronous replay of the same profile
    engine = replace(engine, async_scheduling=False)
    with tempfile.TemporaryDirectory() as tmp:
        dirs, windows = [], []
        for k, rt in enumerate(rts):
            d = Path(tmp) / f"r{k}"
            write_reconstruction(rt, profile, engine, overhead_s, d, rt.source, virtual_engines, frontend)
            dirs.append(d)
            if not open_trace(d).has("steps"):
                from traces.errors import BadInput

                raise BadInput(rt.source, None, "ttft_s", "the fitted twin replays no engine step of this trace: "
                                                          "its measured TTFTs and ends cannot be fitted")
            recon = open_trace(d).read("requests")  # the first measured arrival, on the log's clock
            windows.append((float(recon.loc[recon["ttft_s"].notna(), "arrival_s"].min()), np.inf))
        # the first engine of the reconstruction (a fleet's first replica, a pipeline's first virtual engine): the
        # baselines are per instance, and every instance replays the same engine
        ids = open_trace(dirs[0]).read("instances")["instance_id"].astype(str).tolist()
        first = ids[0]
        data = load_steps(dirs, first if len(ids) > 1 else None)
        start = data.steps["trace"].map({str(d): w[0] for d, w in zip(dirs, windows)})
        derived = throughput_params(data.steps[data.steps["start_s"] >= start])
        traces = [open_trace(d) for d in dirs]
        lps = pooled_lps([lps_params(t.read("steps"), t.read("step_items"), t.read("requests")) for t in traces])
        req = request_params(traces, first, windows)
    if lps:
        derived["lps"] = dict(lps)
        if "arrival_rate" in req:
            derived["lps"]["arrival_rate"] = req["arrival_rate"]
    if "queue" in req:
        derived["queue"] = req["queue"]
    return derived


@dataclass
class Reconstruction:
    trace: object  # traces.store.Trace of the reconstruction
    note: str
    tmp: tempfile.TemporaryDirectory  # kept alive as long as the trace is read
    engine_marks: dict = field(default_factory=dict)  # each replayed setting: value, given/inferred/defaulted, how
    caveats: dict = field(default_factory=dict)  # unmodelled settings accepted at import, incompleteness


def reconstruct_for_estimate(trace, trace_dir, profile_ref: str | None, engine_opts: tuple[str, ...],
                             prefix_cache: str = "cold", fleet=None, frontend: FrontEnd | None = None,
                             overhead_s: float | None = None) -> list[Reconstruction]:
    """``estimate`` on a request-level trace: the twin's reconstruction (in a
    temporary directory) with the measured TTFTs, ready for the estimators;
    one per distinct assignment of a fleet's seeds (``fleet``: a
    ``harness.requestlevel.fleet.FleetSpec``, None: the profile's fit's
    fleet, else one engine; ``frontend`` and ``overhead_s``: a pool's, None:
    the profile's)."""
    from harness.requestlevel.engine_options import (
        frontend_of,
        frontend_overhead,
        marks_json,
        parse_engine_options,
        refuse_unservable,
        request_engine_marked,
        trace_caveats,
        trace_engine,
        virtual_engines,
    )
    from harness.requestlevel.fleet import FleetSpec
    from traces.errors import BadOption
    from traces.store import open_trace

    if profile_ref is None:
        raise BadOption("--profile", "a request-level trace (no steps) needs a profile from calibrate "
                                     "--from-requests to reconstruct its engine")
    profile = load_profile(profile_ref)
    spec = fleet or FleetSpec.from_json(profile.fitted_on.get("fleet"), f"profile {profile.name}'s fit") or FleetSpec()
    options = {**spec.engine, **parse_engine_options(engine_opts)}
    stated = trace_engine([trace])
    engine, marks = request_engine_marked(profile, options, stated=stated)
    from harness.twin.pools.memory import refuse_engine_memory

    refuse_engine_memory(engine, spec.replicas)
    known = {"engine_marks": marks_json(engine, marks), "caveats": trace_caveats([trace])}
    rt = RequestTrace.of(trace).warmed(prefix_cache)
    under = rt.under(spec)
    refuse_unservable(engine, [rt.requests["prompt_tokens"]], [rt.requests["output_tokens"]], options, str(profile_ref),
                      profile, stated)
    fe = frontend if frontend is not None else frontend_of(profile)
    ov = overhead_s if overhead_s is not None else frontend_overhead(profile)
    out = []
    for r in under:
        tmp = tempfile.TemporaryDirectory(prefix="latroute-recon-")
        d = Path(tmp.name) / "recon"
        write_reconstruction(r, profile, engine, ov, d, str(trace_dir), virtual_engines(profile), fe)
        note = RECONSTRUCTED_NOTE + ("" if r.fleet is None else
                                     f" (fleet: {r.fleet.replicas} replicas, assignment {r.fleet.assign}"
                                     + ("" if r.fleet.assign == "logged" else f", seed {r.fleet.seed}") + ")")
        out.append(Reconstruction(open_trace(d), note, tmp, **known))
    return out
