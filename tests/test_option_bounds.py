"""Options a hostile tester found unbounded or unchecked: each refused while parsing or at the
entry, one line naming the option, exit 2, before any work, nothing written."""
from __future__ import annotations

import pytest

from tests.conftest import assert_refused, run_cli

POOL3 = "http://127.0.0.1:8100,http://127.0.0.1:8101,http://127.0.0.1:8102"


# a pool that does not exist: were the speed let through, the command stops at the pool (no server starts)
@pytest.mark.parametrize("cmd", [["serve", "--pool", "no-such-pool.json", "--port-base", "8100"],
                                 ["route", "--pool", "no-such-pool.json", "--backends", POOL3, "--router", "sfs-cc",
                                  "--listen", "127.0.0.1:8200"]])
@pytest.mark.parametrize("speed", ["1e-300", "1e300", "0", "0.0009", "1000001"])
def test_serve_and_route_take_one_speed_range(cmd, speed):
    assert_refused(run_cli(*cmd, "--speed", speed), None, "--speed", "in [0.001, 1e+06]")


def test_the_speed_range_is_stated_in_both_helps():
    for cmd in ("serve", "route"):
        out = run_cli(cmd, "--help").output
        assert "--speed FLOAT [0.001,1e+06]" in out, out
    from harness.cli.params import SPEED

    assert SPEED.check("0.001") == 0.001 and SPEED.check("1e6") == 1e6


@pytest.mark.parametrize("url,frag", [("http://127.0.0.1:99999", "port must be in 1-65535"),
                                      ("http://127.0.0.1:0", "port must be in 1-65535"),
                                      ("http://127.0.0.1:8100,,http://127.0.0.1:8102", "item 2 is not an http(s) URL"),
                                      ("ftp://127.0.0.1:8100", "not an http(s) URL")])
def test_backend_urls_are_checked(tmp_path, url, frag):
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    assert_refused(run_cli("route", "--pool", "no-such-pool.json", "--backends", url, "--router", "sfs-cc", "--listen",
                           "127.0.0.1:8200"), None, "error: --backends:", frag)
    out = tmp_path / "lg"
    assert_refused(run_cli("loadgen", "--backends", url, "--num-prompts", "3", "--out", out), out,
                   "error: --backends:", frag)


def test_loadgen_base_url_port_is_checked(tmp_path):
    out = tmp_path / "lg"
    assert_refused(run_cli("loadgen", "--base-url", "http://127.0.0.1:70000", "--num-prompts", "3", "--out", out),
                   out, "error: --base-url:", "port must be in 1-65535")


@pytest.mark.parametrize("n", ["99999999999999999999", "16777217", "0", "\u00b2"])
def test_route_constant_lengths_within_the_engines_limit(n):
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    assert_refused(run_cli("route", "--pool", "no-such-pool.json", "--backends", POOL3, "--router", "sfs-cc", "--listen",
                           "127.0.0.1:8200", "--lengths", f"constant:{n}"), None, "--lengths",
                   "N in [1, 16777216]")


def test_loadgen_empty_backends_is_refused(tmp_path):
    out = tmp_path / "lg"
    assert_refused(run_cli("loadgen", "--backends", "", "--num-prompts", "3", "--out", out), out,
                   "error: --backends: no URL given")


def test_loadgen_assign_from_without_trace_is_refused(tmp_path):
    (tmp_path / "log").mkdir()
    out = tmp_path / "lg"
    assert_refused(run_cli("loadgen", "--backends", POOL3, "--assign-from", tmp_path / "log", "--num-prompts", "3",
                           "--out", out), out, "error: --assign-from: needs --trace")


@pytest.mark.parametrize("prefix", ["\udcff", "a b", "x" * 65, "r\n"])
def test_loadgen_id_prefix_fits_a_header(tmp_path, prefix):
    out = tmp_path / "lg"
    assert_refused(run_cli("loadgen", "--base-url", "http://127.0.0.1:8100", "--id-prefix", prefix,
                           "--num-prompts", "3", "--out", out), out, "error: --id-prefix: must be at most 64 printable")


def test_loadgen_request_rate_is_bounded_and_inf_still_allowed():
    from harness.cli.loadgen import loadgen

    rate = next(p for p in loadgen.params if p.name == "request_rate").type
    assert rate.check("inf") == float("inf") and rate.check("2") == 2.0
    assert rate.check("1e-300") is None and rate.check("1e300") is None and rate.check("nan") is None


def test_bench_against_a_directory_that_is_no_checkout_is_refused(tmp_path):
    assert_refused(run_cli("bench", "--only", "fleet", "--against", tmp_path), None,
                   "error: --against:", "is no latroute checkout")


def test_bench_against_without_a_section_it_benches_is_refused(tmp_path):
    assert_refused(run_cli("bench", "--only", "generate", "--against", tmp_path), None,
                   "error: --against: benches the twin, replay, sfs, fleet sections only")


@pytest.fixture(scope="module")
def twin_trace(tmp_path_factory):
    from tests.conftest import served_twin_trace

    return served_twin_trace(tmp_path_factory.mktemp("tw") / "tw")


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e300"])
def test_estimate_retrain_every_is_bounded(twin_trace, tmp_path, value):
    """With everything else a learned estimator needs (a nan interval once ended in an internal ValueError)."""
    assert_refused(run_cli("estimate", twin_trace, "--estimators", "learned", "--calibrate-on", twin_trace,
                           "--retrain-every", value, "--out", tmp_path / "e"), tmp_path / "e",
                   "--retrain-every", "must be a finite number in [0, 1e+09]")


def test_estimate_score_window_of_a_handful_of_requests_is_refused(twin_trace, tmp_path):
    out = tmp_path / "e"
    res = run_cli("estimate", twin_trace, "--estimators", "sfs", "--score-window", "0:0.001", "--out", out)
    assert_refused(res, out, "error: --score-window: 0:0.001 scores 3 of the trace's 300 requests",
                   "at least 20")
    assert "Mean of empty slice" not in res.output
    assert "at least 20 requests" in " ".join(run_cli("estimate", "--help").output.split())


def test_validate_score_window_without_requests_is_refused(tmp_path):
    from tests.test_reqstats_import import _run

    src = _run(tmp_path)
    assert run_cli("trace", "import", "vllm-reqstats", src, "--out", tmp_path / "t").exit_code == 0
    out = tmp_path / "v"
    res = run_cli("validate", tmp_path / "t", "--profile", "qwen3-8b-h100", "--score-window", "0:0.001",
                  "--out", out)
    assert_refused(res, out, "error: --score-window: 0:0.001 scores 0 of the trace's 6 requests", "at least 20")
    assert "at least 20 requests" in " ".join(run_cli("validate", "--help").output.split())


def test_a_pool_entrys_url_port_is_checked(tmp_path):
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    import json

    pool = tmp_path / "u.json"
    pool.write_text(json.dumps({"name": "u", "instances": [{"instance_id": "a", "model": "qwen3-8b", "profile":
                                                            "qwen3-8b-h100", "url": "http://127.0.0.1:99999"}]}))
    assert_refused(run_cli("route", "--pool", pool, "--router", "shortest-queue", "--listen", "127.0.0.1:8200"),
                   None, f"error: {pool}:1: instances.url: 'http://127.0.0.1:99999': the port must be in 1-65535")
