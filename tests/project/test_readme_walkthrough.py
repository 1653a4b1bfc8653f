"""The README's walkthrough runs as written (docs that cannot rot).

Every ```bash block of README.md after the first (the two set-up commands)
runs, in order, in one shell per block (``bash -euo pipefail``), in a
temporary directory laid out as a user has it: ``tmp/work`` is the clone
(its top-level files and folders linked in, so ``tests/plugin_router.py``
is there) and ``tmp/shared/data`` is the shared data beside it, so the
README's ``../shared/data/...`` paths resolve. ``latroute`` is a console
script like the one ``pip install -e .`` writes: it finds latroute's five
packages and nothing else of the clone (so a plug-in under ``tests/``
needs the README's ``PYTHONPATH=.``, as it does for a user). Blocks whose
first line is ``# needs vLLM`` run only when LATROUTE_VLLM_PYTHON names
vLLM's interpreter. The whole test skips when the shared data is absent.

Slow (a few minutes on 2 cores), so behind the ``docs`` marker:
``python -m pytest -q -m docs``.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED_DATA

pytestmark = pytest.mark.docs

PACKAGES = ("harness", "traces", "estimators", "routers", "reports")  # [tool.setuptools.packages.find]
NEEDS_VLLM = "# needs vLLM"
BLOCK_TIMEOUT_S = 900


def bash_blocks(text: str) -> list[str]:
    """The bodies of the ```bash fenced blocks, in order."""
    return [m.group(1) for m in re.finditer(r"^```bash\n(.*?)^```\s*$", text, re.S | re.M)]


def clone_entries() -> list[str]:
    """The top-level names a fresh clone has: the tracked ones (git), else every non-hidden entry
    but build outputs."""
    try:
        files = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True,
                               check=True).stdout.split()
        names = sorted({f.split("/")[0] for f in files} - {".ci", ".gitignore"})
        if names:
            return [n for n in names if (REPO / n).exists()]
    except (OSError, subprocess.CalledProcessError):
        pass
    return sorted(e.name for e in REPO.iterdir() if not e.name.startswith(".")
                  and e.name not in ("site", "build", "dist", "latroute-demo") and not e.name.endswith(".egg-info"))


def fake_clone(tmp: Path) -> tuple[Path, dict]:
    """tmp/work (the clone), tmp/shared/data, and the environment a user's
    shell has after ``pip install -e .``: returns (cwd, env)."""
    work, shared, site, bindir = tmp / "work", tmp / "shared", tmp / "site", tmp / "bin"
    for d in (work, shared, site, bindir):
        d.mkdir()
    for name in clone_entries():
        (work / name).symlink_to(REPO / name)
    (shared / "data").symlink_to(SHARED_DATA.resolve())
    models = SHARED_DATA.resolve().parent / "models"
    if models.is_dir():
        (shared / "models").symlink_to(models)
    for pkg in PACKAGES:  # the editable install maps these packages only
        (site / pkg).symlink_to(REPO / pkg)
    script = bindir / "latroute"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.path.append({str(site)!r})\n"
                      "from harness.cli import main\nsys.exit(main())\n")
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LATROUTE_SHARED_DATA")}
    env["PATH"] = os.pathsep.join([str(bindir), str(Path(sys.executable).parent), env.get("PATH", "")])
    return work, env


def test_readme_walkthrough_runs_as_written(tmp_path):
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data not available: {SHARED_DATA}")
    blocks = bash_blocks((REPO / "README.md").read_text())
    assert blocks and "pip install" in blocks[0], "the README must start with the set-up commands"
    cwd, env = fake_clone(tmp_path)
    vllm = bool(os.environ.get("LATROUTE_VLLM_PYTHON"))
    ran, skipped = 0, 0
    for n, block in enumerate(blocks[1:], start=2):
        if block.lstrip().startswith(NEEDS_VLLM) and not vllm:
            skipped += 1
            continue
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=BLOCK_TIMEOUT_S)
        assert proc.returncode == 0, (f"README bash block {n} failed (exit {proc.returncode}):\n{block}\n"
                                      f"--- stdout (tail)\n{proc.stdout[-3000:]}\n--- stderr (tail)\n"
                                      f"{proc.stderr[-3000:]}")
        ran += 1
    assert ran >= 5, f"only {ran} blocks ran"
    print(f"ran {ran} README blocks, skipped {skipped} that need vLLM")
