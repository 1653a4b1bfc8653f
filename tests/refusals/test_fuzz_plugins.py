"""Plug-in faults: router and estimator plug-ins are foreign
code. One that raises in ``__init__``, ``choose`` or ``estimate``, or
returns an index out of range, negative, NaN, a float, None or a string (a
TTFT that is NaN, negative or not a number), is reported as ``error: plug-in 'mod:Class' ...`` with exit 2, and
nothing is written (``replay``, ``sweep``, ``estimate``).

The faulty plug-ins are written into a temporary module at run time (the
tests own no module on the import path); the matrix runs in a worker
process (an index past the end may reach compiled code), a few cases also
in the default suite, in process (those reach no kernel before failing)."""
from __future__ import annotations

import itertools
import re
import textwrap
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.refusals.test_bad_input_files import small_recording
from tests.support.fuzz_corruptors import Outcome, Worker, in_process, record

_COUNTER = itertools.count()

ROUTER_FAULTS = {  # class name: body of the class (a Router subclass)
    "RaiseInit": "def __init__(self, *a, **k):\n    raise RuntimeError('boom in init')\n"
                 "def choose(self, i, t, insts):\n    return 0",
    "RaiseChoose": "def choose(self, i, t, insts):\n    raise RuntimeError('boom in choose')",
    "PastEnd": "def choose(self, i, t, insts):\n    return len(insts)",
    "Negative": "def choose(self, i, t, insts):\n    return -1",
    "NaN": "def choose(self, i, t, insts):\n    return float('nan')",
    "Float": "def choose(self, i, t, insts):\n    return 0.5",
    "NoneIndex": "def choose(self, i, t, insts):\n    return None",
    "String": "def choose(self, i, t, insts):\n    return '0'",
    "Huge": "def choose(self, i, t, insts):\n    return 2**70",
    "LateRaise": "def choose(self, i, t, insts):\n    if i > 10:\n        raise KeyError(i)\n    return 0",
}
ESTIMATOR_FAULTS = {
    "ERaiseInit": "def __init__(self, *a, **k):\n    raise RuntimeError('boom in init')",
    "ERaise": "def __init__(self, *a, **k):\n    pass\ndef estimate(self, snap, q):\n    raise ValueError('boom')",
    "ENaN": "def __init__(self, *a, **k):\n    pass\ndef estimate(self, snap, q):\n    return float('nan')",
    "ENegative": "def __init__(self, *a, **k):\n    pass\ndef estimate(self, snap, q):\n    return -1.0",
    "ENone": "def __init__(self, *a, **k):\n    pass\ndef estimate(self, snap, q):\n    return None",
    "EString": "def __init__(self, *a, **k):\n    pass\ndef estimate(self, snap, q):\n    return '0.1'",
    "EList": "def __init__(self, *a, **k):\n    pass\ndef estimate(self, snap, q):\n    return [0.1]",
    "ENoEstimate": "def __init__(self, *a, **k):\n    pass",
}


def plugin_module(root: Path) -> str:
    """Write the faulty plug-ins into a fresh module under ``root``; its name."""
    name = f"fz_plugins_{next(_COUNTER)}"
    parts = ["from routers.base import Router\n"]
    for cls, body in ROUTER_FAULTS.items():
        parts.append(f"class {cls}(Router):\n    summary = 'fault'\n" + textwrap.indent(body, "    ") + "\n")
    for cls, body in ESTIMATOR_FAULTS.items():
        parts.append(f"class {cls}:\n" + textwrap.indent(body, "    ") + "\n")
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.py").write_text("\n".join(parts))
    return name


def judged(o: Outcome, spec: str, out: Path) -> str | None:
    lines = [ln for ln in o.stderr.splitlines() if ln.strip()]
    if o.code < 0 or o.code == 999:
        return f"crash or hang ({o.code}): {o.stderr[-200:]}"
    if "Traceback" in o.text or "internal error" in o.text:
        return f"exit {o.code}: {(lines or [''])[-1][:200]}"
    if o.code != 2 or len(lines) != 1:
        return f"exit {o.code}, {len(lines)} stderr lines: {(lines or [''])[0][:200]}"
    # the promised "error: plug-in 'mod:Class' ..." (click's "latroute CMD: " before it, or "router"/"estimator", allowed)
    if not re.match(rf"error: (latroute [\w ]+: )?((router|estimator) )?plug-in '?{re.escape(spec)}", lines[0]):
        return f"exit 2 but not 'error: plug-in {spec} ...': {lines[0][:200]}"
    if out.exists() or any(p.name.startswith(f".{out.name}.") for p in out.parent.iterdir()):
        return f"exit 2 but {out.name} written"
    return None


def router_args(spec: str, out: Path) -> list:
    return ["replay", "--rate", "4", "--requests", "30", "--router", spec, "--out", out]


def sweep_args(spec: str, out: Path) -> list:
    return ["sweep", "--rates", "4", "--requests", "30", "--routers", spec, "--workers", "1", "--out", out]


def estimate_args(spec: str, tr: Path, profile: Path, out: Path) -> list:
    return ["estimate", tr, "--profile", profile, "--estimators", f"sfs,{spec}", "--out", out]


@pytest.mark.parametrize("cls", ["RaiseInit", "RaiseChoose", "NoneIndex"])
def test_a_faulty_router_plugin_is_named(tmp_path, monkeypatch, cls):
    mod = plugin_module(tmp_path / "plug")
    monkeypatch.syspath_prepend(str(tmp_path / "plug"))
    spec = f"{mod}:{cls}"
    out = tmp_path / "out"
    problem = judged(in_process(router_args(spec, out)), spec, out)
    assert problem is None, f"replay --router {spec} → {problem}"


@pytest.mark.fuzz
def test_every_plugin_fault_in_every_command(tmp_path):
    plug = tmp_path / "plug"
    mod = plugin_module(plug)
    rec_root = tmp_path / "rec"
    rec_root.mkdir()
    assert run_cli("trace", "import", "vllm-record", small_recording(rec_root), "--out", tmp_path / "tr").exit_code == 0
    assert run_cli("calibrate", tmp_path / "tr", "--out", tmp_path / "p.json").exit_code == 0
    worker = Worker(extra_path=plug)
    bad, cases = [], 0
    try:
        for k, cls in enumerate(ROUTER_FAULTS):
            spec = f"{mod}:{cls}"
            for name, make in (("replay", router_args), ("sweep", sweep_args)):
                out = tmp_path / f"{name}-{k}"
                cases += 1
                p = judged(worker.run_confirmed(make(spec, out), 120), spec, out)
                if p:
                    bad.append(f"{name} --router(s) {cls}: {p}")
        for k, cls in enumerate(ESTIMATOR_FAULTS):
            spec = f"{mod}:{cls}"
            out = tmp_path / f"est-{k}"
            cases += 1
            p = judged(worker.run_confirmed(estimate_args(spec, tmp_path / "tr", tmp_path / "p.json", out), 120),
                       spec, out)
            if p:
                bad.append(f"estimate --estimators {cls}: {p}")
    finally:
        worker.close()
    for b in bad:
        record(f"plug-ins: {b}")
    print(f"fuzz plug-ins: {cases} cases, {len(bad)} broken promises")
    assert not bad, "\n".join(bad)
