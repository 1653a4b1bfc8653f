"""loadgen against several emulated servers: ``--backends`` with
``--assign-from`` sends each request to the instance the assignment names,
arrivals with random jitter (nothing is known to the server before a
request arrives); the server's recording shows each request where it was
sent and the kernel agreeing with every recorded step."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from harness.live.loadgen import assign_backends
from tests.harness.serve.test_serve_http import ROOT, SPEED, events, open_stream, start_serve
from traces.errors import BadInput

pytest.importorskip("aiohttp")

IDS = ["qwen3-0.6b", "qwen3-8b", "qwen3-32b"]


def test_assign_backends_follows_the_replay_and_refuses_gaps():
    a = pd.DataFrame({"request_id": [5, 6, 7], "instance_id": ["qwen3-32b", "qwen3-0.6b", "qwen3-8b"]})
    assert assign_backends(np.array([7, 5, 6]), 3, a, IDS) == (1, 2, 0)
    assert assign_backends(np.array([1, 2, 3, 4]), 3, None, None) == (0, 1, 2, 0)
    with pytest.raises(BadInput, match="request 8: not in the replay"):
        assign_backends(np.array([8]), 3, a, IDS)
    with pytest.raises(BadInput, match="only 2 backends"):
        assign_backends(np.array([5]), 2, a, IDS)


def _assignment_trace(path, n: int, seed: int) -> pd.DataFrame:
    from estimators.engine.config import InstanceConfig, instances_table
    from traces.store import TraceWriter

    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(0.05, n))  # ~20 q/s of twin time, jittered
    req = pd.DataFrame({"request_id": np.arange(100, 100 + n), "arrival_s": arrival,
                        "prompt_tokens": rng.integers(20, 400, n), "output_tokens": rng.integers(2, 40, n),
                        "instance_id": rng.choice(IDS, n)})
    with TraceWriter(path) as w:
        w.write_table("requests", req)
        w.write_table("instances", instances_table([InstanceConfig(instance_id=i, model=i) for i in IDS]))
    return req


def test_loadgen_backends_assign_from(tmp_path):
    req = _assignment_trace(tmp_path / "assign", 40, 3)
    p, base = start_serve(tmp_path, "--record", str(tmp_path / "rec"), "--stream-interval", "3")
    try:
        c, resp = open_stream(base, {"prompt": [4] * 10, "max_tokens": 8}, "interval-1")
        ev = events(resp)
        c.close()
        texts = [e["choices"][0]["text"] for e in ev[:-1] if e["choices"]]
        assert [len(t.split()) for t in texts] == [1, 3, 3, 1]  # the first at once, then every 3, the rest at the end
        urls = ",".join(f"http://127.0.0.1:{base + k}" for k in range(3))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        lg = subprocess.run([sys.executable, "-m", "harness.cli", "loadgen", "--backends", urls,
                             "--trace", str(tmp_path / "assign"), "--assign-from", str(tmp_path / "assign"),
                             "--out", str(tmp_path / "client")], env=env, capture_output=True, text=True, timeout=60)
        assert lg.returncode == 0, lg.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    from harness.twin.fidelity.decisions import decision_agreement
    from traces.store import open_trace

    client = open_trace(tmp_path / "client").read("requests").set_index("request_id")
    want = req.set_index("request_id")
    assert (client["instance_id"] == want["instance_id"].reindex(client.index)).all()
    assert (client["output_tokens"] == want["output_tokens"].reindex(client.index)).all()
    rec = open_trace(tmp_path / "rec")
    served = rec.read("requests")
    served = served[served["client_id"] != "interval-1"].copy()
    served["rid"] = served["client_id"].str[1:].astype(int)
    served = served.set_index("rid")
    assert (served["instance_id"] == want["instance_id"].reindex(served.index)).all()
    assert (served["prompt_tokens"] == want["prompt_tokens"].reindex(served.index)).all()
    for inst in IDS:
        r = decision_agreement(rec, inst)
        assert r.agree == r.steps > 0, inst
    from harness.serve.faithful import offline_on_served
    from harness.twin.pools.spec import load_pool

    both = offline_on_served(rec, load_pool("qwen3-h100"))  # the offline twin on the arrivals served
    full = both[rec.read("requests").set_index("request_id").loc[both["request_id"], "finish_reason"].to_numpy()
                == "length"]  # requests no client cut short
    assert len(full) == len(req) + 1
    np.testing.assert_array_equal(full["served"].to_numpy(), full["offline"].to_numpy())


def test_trace_join_takes_a_serve_recording(tmp_path):
    """``trace join`` joins a loadgen run with ``latroute serve --record``'s
    trace of it (it took only the recording scheduler's requests.csv and
    refused this one, pointing at ``record finish``, which does not apply):
    every request joins on its X-Request-Id, the recorded id is the trace's
    own request_id, so ``validate``/``estimate --join`` on that trace accept
    the join, and the overhead is the client's TTFT beyond the recorded one."""
    from tests.conftest import run_cli
    from traces.client_join import read_join
    from traces.store import open_trace

    assert run_cli("trace", "generate", "--requests", 12, "--rate", 8, "--seed", 3, "--out",
                   tmp_path / "wl").exit_code == 0
    p, base = start_serve(tmp_path, "--record", str(tmp_path / "rec"))
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        lg = subprocess.run([sys.executable, "-m", "harness.cli", "loadgen", "--base-url", f"http://127.0.0.1:{base}",
                             "--trace", str(tmp_path / "wl"), "--id-prefix", "j-", "--out", str(tmp_path / "client")],
                            env=env, capture_output=True, text=True, timeout=120)
        assert lg.returncode == 0, lg.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    res = run_cli("trace", "join", tmp_path / "client", tmp_path / "rec", "--out", tmp_path / "j")
    assert res.exit_code == 0, res.output
    assert "joined 12 of 12 client requests (0 failed on the client; 0 recorded requests not from this client)" \
        in res.stdout
    rec = open_trace(tmp_path / "rec")
    joined = read_join(tmp_path / "j", rec, tmp_path / "rec")  # the identity validate checks
    served = rec.read("requests").set_index("client_id")
    joined = joined.set_index("client_id")
    assert (joined["recording_request_id"] == served.loc[joined.index, "request_id"]).all()
    assert np.allclose(joined["engine_ttft_s"], served.loc[joined.index, "ttft_s"])
    # the client's wall seconds on the server's clock (--speed 4): its whole requests take about what the
    # server recorded (left in wall seconds they were a quarter of it), and its first tokens come after the
    # recorded ones (HTTP and streaming cost something)
    assert json.loads((tmp_path / "j" / "join.json").read_text())["server_speed"] == SPEED
    assert np.allclose(joined["client_e2e_s"], joined["engine_e2e_s"], rtol=0.25, atol=0.1), \
        joined[["client_e2e_s", "engine_e2e_s"]]
    assert (joined["overhead_s"] > 0).all(), joined["overhead_s"]
