"""A command whose optional extra is missing refuses in one line, exit 2,
before it reads or writes anything (harness.cli.extras).

The CLI runs in a child whose ``sys.modules`` holds None for the extra's
modules (``import`` then raises ImportError, as where it is not installed),
so these hold whether or not the extra is installed here.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

_WITHOUT = ("import sys\n"
            "for m in {modules!r}:\n"
            "    sys.modules[m] = None\n"
            "sys.argv = ['latroute', *sys.argv[1:]]\n"
            "from harness.cli import main\n"
            "main()\n")


def _run_without(modules: tuple[str, ...], args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``latroute ARGS`` in ``cwd`` in a child where ``modules`` cannot be imported.
    The timeout bounds a server that would start if the refusal were missing."""
    return subprocess.run([sys.executable, "-c", _WITHOUT.format(modules=modules), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=_env())


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("LATROUTE_DEBUG", None)
    return env


def _install(extra: str) -> str:
    return f'python -m pip install -e ".[{extra}]"'


EXTRA_CASES = {
    "serve": (("prometheus_client",), ["serve", "--port-base", "28100", "--record", "rec"],
              f"error: latroute serve needs the serve extra: {_install('serve')}", "rec"),
    "serve-aiohttp": (("aiohttp",), ["serve", "--port-base", "28100", "--record", "rec"],
                      f"error: latroute serve needs the serve extra: {_install('serve')}", "rec"),
    "route": (("prometheus_client",),
              ["route", "--pool", "qwen3-h100", "--backends", "http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3",
               "--router", "shortest-queue", "--listen", "127.0.0.1:1", "--log", "log"],
              f"error: latroute route needs the serve extra: {_install('serve')}", "log"),
    "loadgen": (("aiohttp",), ["loadgen", "--base-url", "http://127.0.0.1:1", "--num-prompts", "2", "--out", "client"],
                f"error: latroute loadgen needs the loadgen extra: {_install('loadgen')}", "client"),
    "sweep-ray": (("ray",), ["sweep", "--backend", "ray", "--rates", "4", "--requests", "20", "--routers",
                             "shortest-queue", "--out", "sweep"],
                  f"error: latroute sweep --backend ray needs the ray extra (Ray): {_install('ray')}", "sweep"),
    "estimate-learned": (("lightgbm",), ["estimate", "missing-trace", "--estimators", "sfs,learned", "--out", "est"],
                         "error: latroute estimate --estimators learned needs the learned extra (LightGBM): "
                         + _install("learned"), "est"),
}


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("case", sorted(EXTRA_CASES))
def test_missing_extra_is_one_line_exit_2_nothing_written(case, tmp_path):
    modules, args, expected, out = EXTRA_CASES[case]
    before = _tree(tmp_path)
    proc = _run_without(modules, args, tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert lines == [expected], lines
    assert proc.stdout == ""
    assert not (tmp_path / out).exists() and _tree(tmp_path) == before


def test_learned_router_without_lightgbm_names_the_extra(tmp_path):
    """replay (and sweep) refuse a learned router in one line that names the
    extra and its install command, before the output exists."""
    proc = _run_without(("lightgbm",), ["replay", "--router", "learned-cc", "--rate", "4", "--requests", "20",
                                        "--out", "r"], tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, lines)
    assert lines[0].startswith("error: ") and "learned extra" in lines[0] and _install("learned") in lines[0], lines
    assert _tree(tmp_path) == []


def test_route_refuses_a_learned_router_without_lightgbm(monkeypatch):
    """The route command's router check names the learned extra (the serve extra is asked first, at its entry)."""
    from harness.cli.extras import MissingExtra
    from harness.cli.route import check_router

    monkeypatch.setitem(sys.modules, "lightgbm", None)
    with pytest.raises(MissingExtra) as e:
        check_router("learned-cc")
    assert e.value.format_message() == ("latroute route --router learned-cc needs the learned extra (LightGBM): "
                                        + _install("learned"))
    check_router("shortest-queue")  # a router without the extra passes


@pytest.mark.parametrize("args", [["serve", "--help"], ["route", "--help"], ["loadgen", "--help"]])
def test_help_needs_no_extra(args, tmp_path):
    """Without aiohttp and prometheus_client, a serving command still explains itself."""
    proc = _run_without(("aiohttp", "prometheus_client"), args, tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: latroute"), proc.stderr[-2000:]
