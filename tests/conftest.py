"""Shared test helpers: the CLI runner and the location of ../shared/data.

Tests that read the shared data skip cleanly when it is absent (set
LATROUTE_SHARED_DATA to point elsewhere)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.cli import cli

REPO = Path(__file__).resolve().parent.parent
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    # A test run started in the background (``cmd &`` in a script, nohup, some CI runners) inherits Ctrl-C
    # ignored, and so would every command a test starts (an ignored signal stays ignored across exec): the
    # tests that send a command SIGINT would see it run on. Python's own handler here makes the commands
    # start with the default disposition, as they do from a terminal (a handler is reset at exec).
    signal.signal(signal.SIGINT, signal.default_int_handler)
if "LATROUTE_CACHE_DIR" not in os.environ:
    # the pool-baseline disk cache (harness.twin.baseline_cache) of this test session only, shared with the
    # CLI processes tests start: tests neither read a user's cache nor leave entries in it
    import atexit
    import shutil
    import tempfile

    os.environ["LATROUTE_CACHE_DIR"] = tempfile.mkdtemp(prefix="latroute-test-cache-")
    atexit.register(shutil.rmtree, os.environ["LATROUTE_CACHE_DIR"], ignore_errors=True)
SHARED_DATA = Path(os.environ.get("LATROUTE_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared(*parts: str) -> Path:
    """Path under the shared data directory; skips the test if it is missing
    (the whole module when called at import, as two modules do for their run
    list: without ``allow_module_level`` that was a collection error, not a
    skip, on a machine without ../shared)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared data not available: {path}", allow_module_level=True)
    return path


def run_cli(*args: str):
    """Invoke ``latroute`` in-process; returns click's Result (exit_code,
    stdout, stderr)."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def served_twin_trace(out: Path) -> Path:
    """A twin trace with steps and TTFTs (300 requests at 6 q/s on qwen3-h100,
    seed 1), written as a recording would be: what the report tests estimate
    on and validate against."""
    from harness.twin.pools.spec import load_pool
    from harness.twin.simulation import Twin, TwinConfig, shortest_queue_router
    from traces.store import TraceWriter
    from traces.workload.arrivals import ArrivalSpec
    from traces.workload.generator import WorkloadConfig, generate_workload

    wl = generate_workload(WorkloadConfig(requests=300, arrivals=ArrivalSpec("poisson", 6.0), seed=1))
    r = Twin.from_pool(load_pool("qwen3-h100"), TwinConfig(seed=1)).run(wl.requests, shortest_queue_router)
    with TraceWriter(out) as w:
        w.meta["frontend_overhead_s"] = 0.005
        for name, df in (("requests", r.requests), ("steps", r.steps), ("step_items", r.step_items),
                         ("instances", r.instances)):
            w.write_table(name, df)
    return out


def assert_refused(result, out: Path | None, *fragments: str) -> None:
    """A refusal: exit 2, one line on stderr naming what is wrong, nothing written."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines
    for frag in fragments:
        assert frag in lines[0], (frag, lines[0])
    if out is not None:
        assert not out.exists(), f"{out} was written"
        leftovers = [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
        assert not leftovers, leftovers


@pytest.fixture(scope="session")
def recordings(tmp_path_factory):
    """Every recording of ../shared/data/vllm_cpu imported once per session."""
    root = shared("vllm_cpu")
    out = tmp_path_factory.mktemp("rec")
    for rec in sorted(p for p in root.iterdir() if p.is_dir()):
        assert run_cli("trace", "import", "vllm-record", rec, "--out", out / rec.name).exit_code == 0
    return out
