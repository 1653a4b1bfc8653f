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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from estimators.calibrate import load_steps
from estimators.derived import throughput_params
from estimators.engine.config import InstanceConfig
from estimators.profile import BatchTimeProfile, load_profile
from harness.request_validate import RequestTrace, replay_requests
from harness.twin import write_twin_trace
from traces.store import TraceWriter

RECONSTRUCTED_NOTE = ("snapshots are RECONSTRUCTED: the trace has no engine steps, so the twin replayed its "
                      "arrivals with the calibrated profile and the estimators read the twin's states; "
                      "errors are against the measured TTFTs")


def write_reconstruction(rt: RequestTrace, profile: BatchTimeProfile, engine: InstanceConfig, overhead_s: float,
                         out: Path, source: str, virtual_engines: int = 1) -> None:
    res = replay_requests(rt, profile, engine, overhead_s, record_steps=True, virtual_engines=virtual_engines)
    reqs = res.requests.copy()
    reqs["ttft_s"] = rt.requests["ttft_s"].to_numpy(dtype=np.float64)
    if "finish_s" in rt.requests:
        reqs["finish_s"] = rt.requests["finish_s"].to_numpy(dtype=np.float64)
    with TraceWriter(out) as w:
        w.meta["source"] = {"kind": "twin-reconstruction", "replay_of": source, "profile": profile.name}
        w.meta["arrivals"] = "measured"
        w.meta["snapshots"] = "reconstructed"
        w.meta["frontend_overhead_s"] = overhead_s
        write_twin_trace(w, res, reqs)


def baseline_params(rts: list[RequestTrace], profile: BatchTimeProfile, engine: InstanceConfig,
                    overhead_s: float, virtual_engines: int = 1) -> dict:
    """The baseline estimators' parameters (``profile.derived``) from the
    twin's reconstructions of the calibration traces: throughput and decode
    step from the reconstructed steps, LPS and the queue fit from those
    steps with the measured TTFTs."""
    from estimators.derived import lps_params, pooled_lps, request_params
    from traces.store import open_trace

    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for k, rt in enumerate(rts):
            d = Path(tmp) / f"r{k}"
            write_reconstruction(rt, profile, engine, overhead_s, d, rt.source, virtual_engines)
            dirs.append(d)
        first = engine.instance_id + (".v0" if virtual_engines > 1 else "")
        data = load_steps(dirs, first if virtual_engines > 1 else None)
        derived = throughput_params(data.steps)
        traces = [open_trace(d) for d in dirs]
        lps = pooled_lps([lps_params(t.read("steps"), t.read("step_items"), t.read("requests")) for t in traces])
        req = request_params(traces, first)
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


def reconstruct_for_estimate(trace, trace_dir, profile_ref: str | None, engine_opts: tuple[str, ...],
                             prefix_cache: str = "cold") -> Reconstruction:
    """``estimate`` on a request-level trace: the twin's reconstruction (in a
    temporary directory) with the measured TTFTs, ready for the estimators."""
    from harness.engine_options import frontend_overhead, parse_engine_options, request_engine, virtual_engines
    from traces.errors import BadOption
    from traces.store import open_trace

    if profile_ref is None:
        raise BadOption("--profile", "a request-level trace (no steps) needs a profile from calibrate "
                                     "--from-requests to reconstruct its engine")
    profile = load_profile(profile_ref)
    engine = request_engine(profile, parse_engine_options(engine_opts))
    rt = RequestTrace.of(trace).warmed(prefix_cache)
    tmp = tempfile.TemporaryDirectory(prefix="latroute-recon-")
    d = Path(tmp.name) / "recon"
    write_reconstruction(rt, profile, engine, frontend_overhead(profile), d, str(trace_dir), virtual_engines(profile))
    return Reconstruction(open_trace(d), RECONSTRUCTED_NOTE, tmp)
