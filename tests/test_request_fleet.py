"""Request logs of a fleet: replicas, their assignment (logged or a stated
policy with seeds), the replicas a run's own completions imply, pools
naming a fitted profile, and the engine view with several engines."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from harness.requestlevel.engine_options import REQUEST_TRACE_DEFAULTS
from harness.requestlevel.fit import profile_of
from harness.requestlevel.validate import RequestTrace, replay_requests
from tests.conftest import run_cli
from tests.test_reqstats_import import _request, _run

PROFILE = np.array([0.02, 2e-5, 2e-4, 1e-8, 0.01])  # const, P, D, sum_ctx, front-end overhead


def _profile(path, virtual_engines: int = 1, engine: dict | None = None):
    prof = profile_of(PROFILE, path.stem)
    prof.fitted_on = {"engine": engine or {"max_num_seqs": 8, "max_num_batched_tokens": 512, "num_kv_blocks": 640},
                      "request_fit": {"frontend_overhead_s": float(PROFILE[4]), "virtual_engines": virtual_engines}}
    prof.save(path)
    return path


def test_engine_view_with_virtual_engines_reads_each_engines_own_steps(tmp_path):
    """Two virtual engines number their steps alike: a request's first
    scheduled step is looked up in its own engine's log (the lookup by
    number alone ended ``validate`` in a TypeError)."""
    from harness.requestlevel.engine_view import _first_scheduled

    reqs = pd.DataFrame({"request_id": np.arange(24), "arrival_s": 0.05 * np.arange(24),
                         "prompt_tokens": np.full(24, 300), "output_tokens": np.full(24, 30),
                         "ttft_s": np.full(24, 0.1)})
    rt = RequestTrace.from_frame(reqs, "mem")
    res = replay_requests(rt, profile_of(PROFILE, "p"), REQUEST_TRACE_DEFAULTS, 0.0, record_steps=True,
                          virtual_engines=2)
    steps, items = res.steps, res.step_items
    assert steps.groupby("step")["instance_id"].nunique().max() == 2  # step numbers repeat across the engines
    got = _first_scheduled(res, len(reqs))
    for rid in range(24):
        mine = items[items["request_id"] == rid]
        inst, step = mine["instance_id"].iloc[0], mine["step"].min()
        want = steps[(steps["instance_id"] == inst) & (steps["step"] == step)]["start_s"].item()
        assert got[rid] == pytest.approx(want)
    assert len(set(res.requests["instance_id"])) == 2


def test_validate_with_a_two_virtual_engine_profile_on_vllm_stamps(tmp_path):
    reqs = [_request(i, 0.1 * i, out=20) for i in range(16)]
    res = run_cli("trace", "import", "vllm-reqstats", _run(tmp_path, reqs), "--out", tmp_path / "t",
                  "--engine", "num_kv_blocks=640")
    assert res.exit_code == 0, res.output
    prof = _profile(tmp_path / "p.json", virtual_engines=2)
    res = run_cli("validate", tmp_path / "t", "--profile", prof, "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "v" / "metrics.json").read_text())
    assert m["virtual_engines"] == 2
    q = m["engine_view"]["queueing"]
    assert q["n"] == 16 and np.isfinite(q["mean"]["twin"])


# --- fleets: a synthetic log made by the twin itself, so the truth is known ---------------------------------

ENGINE = {"max_num_seqs": 8, "max_num_batched_tokens": 512, "num_kv_blocks": 640}


def _lengths(n: int, rate: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"request_id": np.arange(n), "arrival_s": np.cumsum(rng.exponential(1 / rate, n)),
                         "prompt_tokens": rng.integers(50, 400, n), "output_tokens": rng.integers(20, 120, n),
                         "ttft_s": np.full(n, 0.1)})


def _synthetic(out, n: int, rate: float, replicas: int, assign: str = "round-robin", logged: bool = False):
    """A request log as ``replicas`` engines (``ENGINE``, ``PROFILE``) served it, written as a trace."""
    from dataclasses import replace

    from harness.requestlevel.fleet import Fleet
    from traces.store import TraceWriter

    rt = RequestTrace.from_frame(_lengths(n, rate), "mem")
    if replicas > 1:
        rt = replace(rt, fleet=Fleet(replicas, assign, 0))
    res = replay_requests(rt, profile_of(PROFILE, "truth"), replace(REQUEST_TRACE_DEFAULTS, **ENGINE), PROFILE[4])
    reqs = rt.requests.copy()
    reqs["ttft_s"] = res.requests["ttft_s"].to_numpy()
    reqs["finish_s"] = res.requests["finish_s"].to_numpy() + PROFILE[4]
    if logged:
        reqs["instance_id"] = [f"pod-{s[-1]}" for s in res.requests["instance_id"]]
    with TraceWriter(out) as w:
        w.write_table("requests", reqs)
    return out


def test_round_robin_fleet_replays_each_replica_as_one_engine():
    """Round-robin over two replicas is each replica's share replayed alone:
    the same TTFTs to the last bit, and half the queueing of one engine."""
    from dataclasses import replace

    from harness.requestlevel.fleet import Fleet

    rt = RequestTrace.from_frame(_lengths(60, 40.0), "mem")
    prof, eng = profile_of(PROFILE, "p"), replace(REQUEST_TRACE_DEFAULTS, **ENGINE)
    fleet = replay_requests(replace(rt, fleet=Fleet(2, "round-robin", 0)), prof, eng, 0.01)
    assert fleet.requests["request_id"].tolist() == rt.requests["request_id"].tolist()  # the trace's order
    assert fleet.requests["instance_id"].tolist() == ["i0-r0", "i0-r1"] * 30
    for k in (0, 1):
        alone = replace(rt, requests=rt.requests.iloc[k::2].reset_index(drop=True))
        one = replay_requests(alone, prof, replace(eng, instance_id=f"i0-r{k}"), 0.01)
        assert np.array_equal(one.requests["ttft_s"].to_numpy(), fleet.requests["ttft_s"].to_numpy()[k::2])
    single = replay_requests(rt, prof, eng, 0.01)
    assert fleet.requests["ttft_s"].mean() < 0.8 * single.requests["ttft_s"].mean()


def test_assignment_seeds_random_differ_round_robin_is_one_partition():
    from harness.requestlevel.fleet import FleetSpec

    rt = RequestTrace.from_frame(_lengths(40, 10.0), "mem")
    rr = rt.under(FleetSpec(3, "round-robin", 5, "x", stated=True))
    assert len(rr) == 1  # its start relabels the replicas only
    rnd = rt.under(FleetSpec(3, "random", 5, "x", stated=True))
    assert [r.fleet.seed for r in rnd] == [0, 1, 2, 3, 4]
    prof, eng = profile_of(PROFILE, "p"), REQUEST_TRACE_DEFAULTS
    shares = {tuple(replay_requests(r, prof, eng, 0.0).requests["instance_id"]) for r in rnd}
    assert len(shares) == 5
    again = replay_requests(rnd[2], prof, eng, 0.0).requests  # same seed, same replay
    assert again.equals(replay_requests(rnd[2], prof, eng, 0.0).requests)


def test_least_requests_sends_a_request_to_the_emptier_replica():
    """Two long requests at once land on different replicas whatever the
    seed breaks the first tie with; a third, while both are busy and one has
    finished, goes to the idle one."""
    from harness.requestlevel.fleet import FleetSpec

    reqs = pd.DataFrame({"request_id": [0, 1, 2], "arrival_s": [0.0, 0.001, 3.0], "prompt_tokens": [100, 100, 100],
                         "output_tokens": [2, 400, 10], "ttft_s": [0.1, 0.1, 0.1]})
    rt = RequestTrace.from_frame(reqs, "mem")
    for r in rt.under(FleetSpec(2, "least-requests", 4, "x", stated=True)):
        inst = replay_requests(r, profile_of(PROFILE, "p"), REQUEST_TRACE_DEFAULTS, 0.0).requests["instance_id"]
        assert inst[0] != inst[1] and inst[2] == inst[0], (r.fleet, list(inst))


def test_logged_assignment_is_replayed_and_checked(tmp_path):
    logged = _synthetic(tmp_path / "log", 40, 30.0, 2, "random", logged=True)
    res = run_cli("validate", logged, "--profile", _profile(tmp_path / "p.json", engine=ENGINE), "--replicas", "2",
                  "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "v" / "metrics.json").read_text())
    assert m["fleet"]["assign"] == "logged" and m["active_replicas"]["implied"] == 2
    assert m["ttft"]["mape"] < 1e-6  # the twin that wrote the log, on the log's own assignment
    per = pd.read_parquet(tmp_path / "v" / "requests.parquet")
    want = open_trace_requests(logged)["instance_id"].str[-1]
    assert (per["instance_twin"].str[-1].to_numpy() == want.to_numpy()).all()
    assert "each request's instance named by the log" in res.output


def open_trace_requests(path):
    from traces.store import open_trace

    return open_trace(path).read("requests").sort_values(["arrival_s", "request_id"]).reset_index(drop=True)


def test_bad_fleets_are_refused_in_one_line(tmp_path):
    from tests.conftest import assert_refused

    prof = _profile(tmp_path / "p.json", engine=ENGINE)
    plain = _synthetic(tmp_path / "plain", 20, 20.0, 2)
    logged = _synthetic(tmp_path / "logged", 20, 20.0, 2, "random", logged=True)
    out = tmp_path / "v"
    cases = [
        (["validate", plain, "--profile", prof, "--replicas", "0"], "--replicas"),
        (["calibrate", "--from-requests", plain, "--replicas", "0"], "--replicas"),
        (["validate", plain, "--profile", prof, "--replicas", "2"], "--assign", "no instance_id column"),
        (["validate", logged, "--profile", prof, "--replicas", "1"], "instance_id", "names 2 serving instances",
         "but --replicas has 1 replica"),
        (["validate", logged, "--profile", prof, "--replicas", "2", "--assign", "round-robin"], "--assign",
         "round-robin is not what"),
        (["validate", plain, "--profile", prof, "--assign", "random"], "--assign", "only with a fleet"),
        (["validate", plain, "--profile", prof, "--replicas", "1", "--assign", "random"], "--assign",
         "one replica"),
        (["estimate", plain, "--profile", prof, "--replicas", "2", "--assign-seeds", "3"], "--assign"),
        (["validate", logged, "--profile", prof, "--replicas", "2", "--assign-seeds", "3"], "--assign-seeds",
         "no seeds to draw"),
    ]
    for args, *frags in cases:
        target = tmp_path / "p2.json" if args[0] == "calibrate" else out
        assert_refused(run_cli(*args, "--out", target), target, *frags)


def test_a_rotating_log_agrees_with_round_robin(tmp_path):
    rr = _synthetic(tmp_path / "rr", 30, 20.0, 2, "round-robin", logged=True)
    res = run_cli("validate", rr, "--profile", _profile(tmp_path / "p.json", engine=ENGINE), "--replicas", "2",
                  "--assign", "round-robin", "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output


def test_fleet_fit_beats_one_engine_on_a_fleets_log_and_travels_in_the_profile(tmp_path):
    """A log two round-robin replicas wrote, fitted as one engine and as the
    fleet: the fleet's fit is nearer the log (one engine absorbs the second
    replica into its coefficients); the profile carries its fleet, and
    validate takes it from there."""
    log = _synthetic(tmp_path / "log", 120, 25.0, 2)
    args = ["calibrate", "--from-requests", log, "--max-evals", "30", *sum((["--engine", f"{k}={v}"]
                                                                           for k, v in ENGINE.items()), [])]
    res = run_cli(*args, "--replicas", "2", "--assign", "round-robin", "--out", tmp_path / "fleet.json")
    assert res.exit_code == 0, res.output
    one = run_cli(*args, "--out", tmp_path / "one.json")
    assert one.exit_code == 0, one.output
    fleet, single = (json.loads((tmp_path / f).read_text()) for f in ("fleet.json", "one.json"))
    assert fleet["fitted_on"]["fleet"]["replicas"] == 2 and "fleet" not in single["fitted_on"]
    assert fleet["fitted_on"]["request_fit"]["loss"] < 0.5 * single["fitted_on"]["request_fit"]["loss"]
    assert fleet["metrics"]["train"][str(log)]["assign_seeds"]["distinct_assignments"] == 1
    res = run_cli("validate", log, "--profile", tmp_path / "fleet.json", "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    assert "fleet: 2 replica(s) (profile fleet's fit), assignment round-robin" in res.output


def test_active_replicas_from_the_runs_completions(tmp_path):
    """A heavy run one replica of a two-replica fleet served is flagged and
    replayed on one, the full fleet beside; a run both served is not."""
    prof = _profile(tmp_path / "p.json", engine=ENGINE)
    for served, rate in ((1, 25.0), (2, 25.0)):
        log = _synthetic(tmp_path / f"on{served}", 150, rate, served)
        out = tmp_path / f"v{served}"
        res = run_cli("validate", log, "--profile", prof, "--replicas", "2", "--assign", "round-robin", "--out", out)
        assert res.exit_code == 0, res.output
        m = json.loads((out / "metrics.json").read_text())
        a = m["active_replicas"]
        assert a["implied"] == served and a["partly_served"] == (served == 1), a
        assert abs(m["ttft"]["distribution"]["mean"]["error"]) < 0.01  # replayed as the log was made
        if served == 1:
            assert "PARTLY SERVED: 1 of 2" in res.output and m["full_fleet"]["replicas"] == 2
            assert m["full_fleet"]["ttft"]["distribution"]["mean"]["error"] < -0.3
        else:
            assert "full_fleet" not in m


def test_a_pool_naming_a_profile_takes_its_fitted_engine_and_front_end(tmp_path):
    from harness.twin.pools.spec import load_pool
    from traces.errors import BadInput

    prof = profile_of(PROFILE, "fitted")
    prof.fitted_on = {"engine": {"max_num_seqs": 7, "num_kv_blocks": 1234, "max_num_batched_tokens": 4096},
                      "request_fit": {"frontend_overhead_s": 0.042,
                                      "frontend": {"per_request_s": 0.002, "per_output_s": 0.0}}}
    prof.save(tmp_path / "fitted.json")
    entry = {"instance_id": "a", "model": "m", "profile": str(tmp_path / "fitted.json"), "replicas": 2}
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps({"instances": [{**entry, "max_num_seqs": 9}]}))
    p = load_pool(pool, serial_frontend=True)
    c = p.instances[1]
    assert (c.max_num_seqs, c.num_kv_blocks, c.max_num_batched_tokens) == (9, 1234, 4096)  # the entry wins
    assert p.sources[0]["max_num_seqs"] == "pool entry" and p.sources[0]["num_kv_blocks"] == "profile fitted's fit"
    assert p.frontend_overhead_s == 0.042 and p.frontends[0]["per_request_s"] == 0.002
    with pytest.raises(BadInput, match="queues the API server's work"):  # a twin without the queue
        load_pool(pool)
    pool.write_text(json.dumps({"frontend_overhead_s": 0.001,
                                "instances": [{**entry, "frontend": "overhead"}]}))
    p = load_pool(pool)
    assert p.frontend_overhead_s == 0.001 and p.frontends == () and p.instances[0].max_num_seqs == 7


def test_validate_and_estimate_with_a_pool_of_replicas(tmp_path):
    log = _synthetic(tmp_path / "log", 60, 25.0, 2)
    prof = _profile(tmp_path / "p.json", engine=ENGINE)
    pool = tmp_path / "pool.json"
    pool.write_text(json.dumps({"instances": [{"instance_id": "vllm", "model": "m", "profile": str(prof),
                                               "replicas": 2}]}))
    res = run_cli("validate", log, "--pool", pool, "--assign", "round-robin", "--out", tmp_path / "v")
    assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "v" / "metrics.json").read_text())
    assert m["engine"]["max_num_seqs"] == ENGINE["max_num_seqs"]  # the profile's fit, through the pool
    assert m["fleet_spec"]["source"] == f"pool {pool}" and abs(m["ttft"]["distribution"]["mean"]["error"]) < 1e-6
    res = run_cli("estimate", log, "--pool", pool, "--assign", "random", "--assign-seeds", "3",
                  "--estimators", "sfs", "--out", tmp_path / "e")
    assert res.exit_code == 0, res.output
    a = json.loads((tmp_path / "e" / "metrics.json").read_text())["assign_seeds"]
    assert a["reconstructions"] == 3 and len(a["estimators"]["sfs"]["mape"]) == 3
    lo, mid, hi = a["estimators"]["sfs"]["mape"]
    assert lo <= mid <= hi


def test_the_command_lines_choices_are_the_fleets():
    from harness.cli import fleet_options as cli
    from harness.requestlevel import fleet

    assert cli.ASSIGN_CHOICES == fleet.ASSIGN and cli.MAX_REPLICAS == fleet.MAX_REPLICAS
    assert cli.DEFAULT_SEEDS == fleet.DEFAULT_SEEDS


def test_a_warm_fleet_reconstructs_with_each_replicas_cache(tmp_path):
    """Warm replicas each warm their own prompts: the reconstruction holds
    both warm-ups (ids unique across replicas, on one clock, before the
    trace). A replica whose prompts do not fit in its cache has its hits
    handed over while the other's are cached, and estimators still read it."""
    from dataclasses import replace

    from harness.requestlevel.fleet import FleetSpec
    from harness.requestlevel.reconstruct import write_reconstruction
    from traces.store import open_trace

    log = _synthetic(tmp_path / "log", 40, 20.0, 2)
    prof = _profile(tmp_path / "p.json", engine=ENGINE)
    res = run_cli("estimate", log, "--profile", prof, "--replicas", "2", "--assign", "random", "--assign-seeds", "2",
                  "--prefix-cache", "warm", "--estimators", "sfs", "--out", tmp_path / "e")
    assert res.exit_code == 0, res.output  # seed 1 splits the prompts 16/24: 24 do not fit in 640 blocks
    rt = RequestTrace.of(open_trace(log)).warmed("warm").under(FleetSpec(2, "random", 1, "x", stated=True))[0]
    big = replace(REQUEST_TRACE_DEFAULTS, **{**ENGINE, "num_kv_blocks": 4000})
    write_reconstruction(rt, profile_of(PROFILE, "p"), big, 0.01, tmp_path / "recon", "log")
    t = open_trace(tmp_path / "recon")
    reqs, steps = t.read("requests"), t.read("steps")
    warm = reqs[reqs["ttft_s"].isna()]
    assert len(warm) == 40 and reqs["request_id"].is_unique  # every prompt warmed once, on its own replica
    assert set(warm["instance_id"]) == {"i0-r0", "i0-r1"}
    first = reqs.loc[reqs["ttft_s"].notna(), "arrival_s"].min()
    assert (warm["arrival_s"] < first).all() and (steps["start_s"] >= 0).all()
    assert set(t.read("step_items")["request_id"]) <= set(reqs["request_id"])


def test_calibrate_replays_the_logs_own_assignment_without_being_told(tmp_path):
    """A log naming each request's instance is a fleet's log whatever the
    options say: its assignment is replayed by the fit as by validate."""
    logged = _synthetic(tmp_path / "log", 80, 30.0, 2, "random", logged=True)
    engine = sum((["--engine", f"{k}={v}"] for k, v in ENGINE.items()), [])
    res = run_cli("calibrate", "--from-requests", logged, "--max-evals", "4", *engine, "--out", tmp_path / "p.json")
    assert res.exit_code == 0, res.output
    assert "fleet   2 replicas, assignment logged: the log's own" in res.output


def test_a_fleet_fit_writes_the_same_bytes_whatever_the_number_of_workers(tmp_path):
    """The replays of a fit run as independent parts (each trace's replicas) over worker processes,
    put back in order: one worker and three write the same profile, and a part's replay is the
    fleet's replay of its rows."""
    from dataclasses import replace

    from harness.requestlevel.fit import _parts, _timings
    from harness.requestlevel.fleet import Fleet
    from harness.requestlevel.frontend import measured

    log = _synthetic(tmp_path / "log", 40, 25.0, 2)
    rt = replace(RequestTrace.from_frame(open_trace_requests(log), "mem"), fleet=Fleet(2, "round-robin", 1))
    eng = replace(REQUEST_TRACE_DEFAULTS, **ENGINE)
    parts = _parts(rt, eng)
    assert sorted(np.concatenate([p.rows for p in parts]).tolist()) == list(range(40)) and len(parts) == 2
    for fe, ve in ((None, 1), (measured(), 1), (measured(), 2)):  # the deliveries read the steps' timings
        whole = replay_requests(rt, profile_of(PROFILE, "p"), eng, 0.01, virtual_engines=ve, frontend=fe).requests
        for p in parts:
            ttft, fin = _timings(p, profile_of(PROFILE, "p"), 0.01, ve, fe)
            assert np.array_equal(ttft, whole["ttft_s"].to_numpy()[p.rows])
            assert np.array_equal(fin, whole["finish_s"].to_numpy()[p.rows])
    args = ["calibrate", "--from-requests", log, "--max-evals", "6", "--replicas", "2", "--assign", "random",
            "--assign-seeds", "2", "--frontend", "measured",
            *sum((["--engine", f"{k}={v}"] for k, v in ENGINE.items()), [])]
    outs = []
    for jobs in ("1", "3"):
        res = run_cli(*args, "--jobs", jobs, "--name", "p", "--out", tmp_path / f"p{jobs}.json")
        assert res.exit_code == 0, res.output
        outs.append((tmp_path / f"p{jobs}.json").read_bytes())
    assert outs[0] == outs[1]
