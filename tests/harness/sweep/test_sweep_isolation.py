"""``sweep --isolate-plugins``: its plug-in routers run each in a process
of its own, with the in-process results (the same decisions, so the same
rows), and the sweep says so (results.parquet, metrics.json, its
summary). ``route`` refuses the option by name: its decisions are in the
request path."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pandas as pd
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
PLUGIN = "tests.plugin_router_views:LeastLoaded"


def latroute(*args):
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=400)


def _sweep(out: pathlib.Path, *extra: str):
    return latroute("sweep", "--rates", "6,12", "--routers", f"{PLUGIN},shortest-queue", "--requests", "80",
                    "--seeds", "2", "--noise", "off", "--out", str(out), *extra)


def test_sweep_isolated_gives_the_in_process_results(tmp_path):
    a, b = tmp_path / "in", tmp_path / "iso"
    ra = _sweep(a, "--workers", "1")
    assert ra.returncode == 0, ra.stderr[-2000:]
    rb = _sweep(b, "--workers", "2", "--isolate-plugins", "--plugin-timeout", "30")
    assert rb.returncode == 0, rb.stderr[-2000:]
    da, db = pd.read_parquet(a / "results.parquet"), pd.read_parquet(b / "results.parquet")
    assert "router_isolated" not in da
    plug = db["router"] == PLUGIN
    assert db.loc[plug, "router_isolated"].eq(True).all() and db.loc[~plug, "router_isolated"].isna().all()
    pd.testing.assert_frame_equal(da, db.drop(columns="router_isolated"))
    assert da.loc[da["router"] == PLUGIN, "ontime_utility"].nunique() > 1  # decisions that depend on the load
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (a, b))
    assert "plugins_isolated" not in ma and mb["plugins_isolated"] is True and mb["plugin_timeout_s"] == 30.0
    assert ma["routers"] == mb["routers"]
    assert "plug-in routers isolated" in rb.stdout and "plug-in routers isolated" not in ra.stdout


def test_sweep_plugin_timeout_alone_is_refused(tmp_path):
    r = _sweep(tmp_path / "x", "--plugin-timeout", "5")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--plugin-timeout" in r.stderr
    assert not (tmp_path / "x").exists()


def test_route_refuses_isolate_plugins_by_name(tmp_path):
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    for extra in (["--isolate-plugins"], ["--isolate-plugins", "--plugin-timeout", "5"], ["--plugin-timeout", "5"]):
        r = latroute("route", "--pool", "qwen3-h100", "--backends", "http://127.0.0.1:1,http://127.0.0.1:2,"
                     "http://127.0.0.1:3", "--router", PLUGIN, "--listen", "127.0.0.1:1", *extra)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert extra[0] in r.stderr and "request path" in r.stderr
