"""Signals at random moments: SIGINT or SIGTERM sent to a
writing command (``trace generate``, ``trace import``, ``replay``,
``sweep``) after a drawn delay, in a child process of its own.

The promise: the command ends (no hang), by finishing (exit 0, complete
output), by Ctrl-C (exit 130, one ``interrupted`` line) or by SIGTERM
(killed by it, or exit 143); no traceback; and what it leaves is either
the complete output or nothing but its own pid-named temporary
(``.OUT.tmp-PID-...``, which the next run cleans) and the lock file
beside it (``.OUT.lock``, whose flock the kernel frees); a sweep leaves
its finished cells under an ``INCOMPLETE`` marker, for ``--resume``. ``demo`` is slow and
left to its own tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import REPO, SHARED_DATA, shared
from tests.fuzzing import Campaign, campaign_seconds, long_settings
from traces.store import open_trace


def commands(out: Path) -> dict[str, tuple[list, float]]:
    """name: (arguments, about how long it runs here, seconds)."""
    az = shared("azure_llm_2023", "AzureLLMInferenceTrace_conv.csv")
    return {
        "trace generate": (["trace", "generate", "--requests", "300000", "--rate", "8", "--out", out], 7.0),
        "trace import": (["trace", "import", "azure", az, "--out", out], 4.0),
        "replay": (["replay", "--rate", "8", "--requests", "3000", "--out", out], 9.0),
        "sweep": (["sweep", "--rates", "3,4", "--requests", "1500", "--routers", "shortest-queue", "--workers", "1",
                   "--out", out], 13.0),
    }


def complete(name: str, out: Path) -> None:
    """The output a finished run leaves."""
    if name.startswith("trace"):
        assert len(open_trace(out).read("requests")) > 0
    else:
        json.loads((out / "metrics.json").read_text())
        if name == "sweep":
            import pandas as pd
            assert len(pd.read_parquet(out / "results.parquet")) == 2


def interrupted(name: str, args: list, out: Path, sig: int, delay: float) -> str | None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LATROUTE_SHARED_DATA": str(SHARED_DATA)}
    p = subprocess.Popen([sys.executable, "-m", "harness.cli", *map(str, args)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    time.sleep(delay)
    if p.poll() is None:
        os.kill(p.pid, sig)
    try:
        _, err = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return f"still running 90 s after {signal.Signals(sig).name}"
    text = err.decode("utf-8", "replace")
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("[local]")]
    if "Traceback" in text:
        return f"traceback after {signal.Signals(sig).name}: {lines[-1][:160] if lines else ''}"
    code = p.returncode
    ok_codes = {0, 130} if sig == signal.SIGINT else {0, -signal.SIGTERM, 128 + signal.SIGTERM}
    if code == -signal.SIGINT and out.exists():  # came after the work, as the interpreter exited: judged below
        ok_codes.add(code)
    if code not in ok_codes:
        return f"exit {code} after {signal.Signals(sig).name}: {(lines or [''])[-1][:160]}"
    if code == 130 and not (lines == ["interrupted"] or (name == "sweep" and len(lines) == 1
                                                          and lines[0].startswith("interrupted: "))):
        return f"exit 130 with stderr {lines[:2]}"
    left = sorted(x.name for x in out.parent.iterdir() if x.name != "log")
    if code == 0:
        try:
            complete(name, out)
        except Exception as e:  # noqa: BLE001 - the output is what is judged
            return f"exit 0 but output incomplete: {type(e).__name__}: {str(e)[:120]}"
        stray = [x for x in left if x not in (out.name, f".{out.name}.lock")]
        return f"exit 0 but left {stray}" if stray else None
    if name == "sweep" and (out / "INCOMPLETE").exists():  # by design: its finished cells, for --resume
        left.remove(out.name)
    elif out.exists():  # the signal came after the output was renamed into place: it must be whole
        try:
            complete(name, out)
            left.remove(out.name)
        except Exception as e:  # noqa: BLE001 - the output is what is judged
            return f"{signal.Signals(sig).name} left a partial {out.name}: {type(e).__name__}: {str(e)[:120]}"
    # its pid-named temporary, and the lock file (flock'ed, freed by the kernel, traces.files.outputs)
    stray = [x for x in left if not x.startswith(f".{out.name}.tmp-{p.pid}-") and x != f".{out.name}.lock"]
    return f"{signal.Signals(sig).name} left {stray}" if stray else None


@pytest.mark.fuzz
def test_signals_at_random_moments_leave_nothing_half_written(tmp_path):
    camp = Campaign("signals→generate,import,replay,sweep", campaign_seconds(0.08))
    runs = iter(range(10**6))

    @long_settings(100_000)
    @given(name=st.sampled_from(["trace generate", "trace import", "replay", "sweep"]),
           sig=st.sampled_from([signal.SIGINT, signal.SIGTERM]), share=st.floats(0.05, 1.1))
    def one(name, sig, share):
        camp.tick()
        d = tmp_path / f"run{next(runs)}"
        d.mkdir()
        out = d / "out"
        args, seconds = commands(out)[name]
        delay = max(share * seconds, 0.2)
        camp.judge(f"{name}: {signal.Signals(sig).name} after {delay:.2f} s", interrupted(name, args, out, sig, delay))

    camp.run(one)
    camp.finish()
