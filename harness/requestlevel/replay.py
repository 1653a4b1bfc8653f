"""Replaying a request-level trace on the twin: one engine, or a fleet of
replicas sharing the log.

One engine (``_replay_one``): the client's arrivals through the serial
front end (``harness.requestlevel.frontend``), a warm prefix cache's
warm-up first (``harness.requestlevel.cache``), the deliveries of the
output tokens (``harness.requestlevel.delivery``).

A fleet (``RequestTrace.fleet``, ``harness.requestlevel.fleet``): each
request's replica comes from the log, from the stated round-robin or
random assignment, or (least requests) from the twin's own replay of the
fleet (``harness.requestlevel.fleet_replay``); each replica then replays
its requests as one engine does, with its own front end, its own cache and
its own noise stream, and the replicas' results are put back together in
the trace's order (``merge_replicas``). Replicas share nothing but the log:
a replay of each on its own is the fleet's replay once the assignment is
fixed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from estimators.engine.config import InstanceConfig
from estimators.timemodel.profile import BatchTimeProfile
from harness.requestlevel.cache import given_hits, warm_fits, warm_input
from harness.requestlevel.delivery import replay_with_deliveries
from harness.requestlevel.fleet import LEAST_REQUESTS, LOGGED, logged_instances, replica_seed, static_assignment
from harness.requestlevel.fleet_replay import least_requests_assignment, merge_replicas
from harness.requestlevel.frontend import FrontEnd
from harness.requestlevel.request_trace import RequestTrace
from harness.requestlevel.twin_timings import TimingTwin
from harness.twin.pools.spec import replica_id
from harness.twin.simulation import InstanceSpec, Twin, TwinConfig, TwinResult, fixed_router, shortest_queue_router


def replay_requests(rt: RequestTrace, profile: BatchTimeProfile, engine: InstanceConfig, overhead_s: float,
                    record_steps: bool = False, noise: bool = False, seed: int = 0,
                    virtual_engines: int = 1, frontend: FrontEnd | None = None) -> TwinResult:
    """Replay the trace's arrivals: on one engine (every request to it), or
    on ``rt.fleet``'s replicas (each one engine as below, ``engine``'s
    settings each; instance ids ``<instance_id>-r<k>``). The result's
    ``requests`` are the trace's rows in its order, with ``instance_id``
    the replica (and virtual engine) that served each; ``extra["fleet"]``
    says how many requests each replica got."""
    fleet = rt.fleet
    if fleet is None or fleet.replicas <= 1:
        return _replay_one(rt, profile, engine, overhead_s, record_steps, noise, seed, virtual_engines, frontend)
    if fleet.assign == LEAST_REQUESTS:
        assignment = least_requests_assignment(rt, replace_profile_name(engine, profile), profile, overhead_s, noise,
                                               seed)
        parts = _parts(rt, engine, seed, assignment)
    else:
        parts = replica_parts(rt, engine, seed)
    return merge_replicas([(p.replica, p.rows, _replay_one(p.rt, profile, p.engine, overhead_s, record_steps, noise,
                                                           p.seed, virtual_engines, frontend)) for p in parts],
                          len(rt.requests), fleet, virtual_engines)


@dataclass(frozen=True)
class ReplicaPart:
    """One replica's share of a fleet's replay: its requests (``rows`` of the trace, in order), as a
    trace of their own, the replica's engine and noise seed. Replicas share nothing but the log, so
    the parts replay independently (in any order, in any process) and give the fleet's replay."""

    replica: int
    rows: np.ndarray
    rt: RequestTrace
    engine: InstanceConfig
    seed: int


def replica_parts(rt: RequestTrace, engine: InstanceConfig, seed: int = 0) -> list[ReplicaPart]:
    """The parts of ``rt``'s replay whose assignment needs no engine: one engine's (``rt.fleet`` None
    or one replica: the whole trace), the log's own or a stated round-robin or random one. Least
    requests decides on the twin itself: refused (ValueError)."""
    fleet = rt.fleet
    if fleet is None or fleet.replicas <= 1:
        return [ReplicaPart(0, np.arange(len(rt.requests)), rt, engine, seed)]
    if fleet.assign == LEAST_REQUESTS:
        raise ValueError("least requests assigns on the twin: its replicas' parts are not known before the replay")
    assignment = logged_instances(rt.requests, rt.source) if fleet.assign == LOGGED else \
        static_assignment(len(rt.requests), fleet)
    return _parts(rt, engine, seed, assignment)


def _parts(rt: RequestTrace, engine: InstanceConfig, seed: int, assignment: np.ndarray) -> list[ReplicaPart]:
    fleet = rt.fleet
    parts = []
    for k in range(fleet.replicas):
        rows = np.flatnonzero(assignment == k)
        if not rows.size:
            continue  # a replica the assignment left idle: it has nothing to replay
        sub = replace(rt, requests=rt.requests.iloc[rows].reset_index(drop=True), fleet=None)
        eng = replace(engine, instance_id=replica_id(engine.instance_id, k, fleet.replicas))
        parts.append(ReplicaPart(k, rows, sub, eng, replica_seed(seed, k)))
    return parts


def part_timings(part: ReplicaPart, profile: BatchTimeProfile, overhead_s: float, virtual_engines: int = 1,
                 frontend: FrontEnd | None = None) -> tuple[np.ndarray, np.ndarray]:
    """One part's replayed TTFT and finish per request (its rows' order; noise off): the numbers of
    ``replay_requests``'s ``ttft_s`` and ``finish_s``, without its tables (``twin_timings``)."""
    return _replay_one(part.rt, profile, part.engine, overhead_s, seed=part.seed, virtual_engines=virtual_engines,
                       frontend=frontend, timings_only=True)


def _replay_one(rt: RequestTrace, profile: BatchTimeProfile, engine: InstanceConfig, overhead_s: float,
                record_steps: bool = False, noise: bool = False, seed: int = 0,
                virtual_engines: int = 1, frontend: FrontEnd | None = None,
                timings_only: bool = False) -> TwinResult | tuple[np.ndarray, np.ndarray]:
    """Replay the arrivals on one instance (every request to it). ``timings_only``: the TTFT and
    finish per request only (``part_timings``).

    ``frontend`` (``harness.requestlevel.frontend``) turns the client's arrivals into
    the engine's; TTFTs are from the client's arrival, as measured, and
    ``added_s`` is when the engine got the request. With a delivery cost
    (``harness.requestlevel.delivery``) ``ttft_s`` and ``finish_s`` are when the
    client gets the first and the last token, as measured. A warm trace replays
    its prompts' warm-up first (``harness.requestlevel.cache``; hits handed
    over outright when they cannot all fit in the cache); the result's
    ``requests`` are the trace's rows only, on the trace's clock (the
    warm-up is in ``extra["warmup"]``, and it and the log are on the
    replay's clock, ``extra["time_shift_s"]`` later).

    ``virtual_engines`` > 1 models vLLM V0's pipeline parallelism: with
    ``pipeline_parallel_size`` N the engine keeps N schedulers ("virtual
    engines"), each running its own batch through the pipeline, and gives a
    new request to the one with the fewest unfinished requests. Each is a
    twin instance with the full step time; requests go to the one with the
    fewest residents (ties: lowest index)."""
    fe = frontend or FrontEnd()
    base = replace_profile_name(engine, profile)
    reqs = rt.requests[["request_id", "arrival_s", "prompt_tokens", "output_tokens"]].copy()
    client = reqs["arrival_s"].to_numpy(dtype=np.float64)
    n_warm, per_engine, block_tokens, shift, hits = 0, 1, None, 0.0, None
    prompts = reqs["prompt_tokens"].to_numpy()
    warm_hits = rt.prefix_cache == "warm" and not warm_fits(prompts, base.block_size, base.num_kv_blocks)
    if warm_hits:
        hits = given_hits(prompts)
    elif rt.prefix_cache == "warm":
        w = warm_input(reqs, base.block_size, virtual_engines)
        n_warm, per_engine, shift, reqs = w.n_warm, max(w.per_engine, 1), w.shift_s, w.requests
        base, block_tokens = replace(base, prefix_caching=True), base.block_size
    if virtual_engines == 1:
        specs = [InstanceSpec(base, profile)]
        router = fixed_router(np.zeros(len(reqs), dtype=np.int64))
    else:
        specs = [InstanceSpec(replace(base, instance_id=f"{base.instance_id}.v{k}"), profile)
                 for k in range(virtual_engines)]

        def router(i: int, t: float, insts: list) -> int:  # the warm-up: every prompt on every engine
            return i // per_engine if i < n_warm else shortest_queue_router(i, t, insts)
    twin = (TimingTwin if timings_only else Twin)(specs, TwinConfig(seed=seed, noise=noise,
                                                                     record_steps=record_steps or fe.delivers,
                                                                     frontend_overhead_s=overhead_s))

    def run(entry: np.ndarray) -> tuple[TwinResult, np.ndarray, np.ndarray]:
        r = reqs.copy()
        r.loc[n_warm:, "arrival_s"] = entry + shift  # the warm-up rows keep theirs
        res = twin.run(r, router, hits=hits, hash_block_tokens=block_tokens)
        t = np.asarray(res.requests["ttft_s"], dtype=np.float64)[n_warm:]
        fin = np.asarray(res.requests["finish_s"], dtype=np.float64)[n_warm:] - shift
        return res, entry + t - overhead_s, fin  # the engine's first and last tokens, on the trace's clock

    if fe.delivers:
        res, entry, dl = replay_with_deliveries(run, client, fe, shift)
        first_t, finish = dl.first_token_s, dl.last_token_s
        delivery = {"rounds": dl.rounds, "unsettled_s": dl.moved_s}
    else:
        entry = fe.engine_arrivals(client)
        res, first_t, finish = run(entry)
        delivery = None
    if timings_only:
        return first_t - client + overhead_s, finish
    out = res.requests.iloc[n_warm:].reset_index(drop=True)
    out["arrival_s"] = client
    out["ttft_s"] = first_t - client + overhead_s
    out["added_s"] = entry
    out["finish_s"] = finish
    warm = None if rt.prefix_cache == "cold" else ("outright" if hits is not None else "engine cache")
    return replace(res, requests=out, extra={**res.extra, "warmup": res.requests.iloc[:n_warm], "time_shift_s": shift,
                                             "warm_hits": warm, "deliveries": delivery})


def replace_profile_name(engine: InstanceConfig, profile: BatchTimeProfile) -> InstanceConfig:
    return replace(engine, profile=engine.profile or profile.name, model=engine.model or profile.name)
