"""A cached kernel follows the code it was compiled from, not only its own file.

Why: Numba keys a cached kernel on its own file's source (numba/numba#6018);
a constant or a function of another module compiled into it stays as it was
when that module changes, and a module that moved fails to load on every
call. The first test shows the stale answer Numba gives alone, so the
second proves the mend, not an accident of the set-up.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from estimators.kernel_cache import DEPS_SUFFIX, drop_stale, source_closures

KERNEL = """
from numba import njit

from estimators.limits import SCALE


@njit(cache=True)
def scaled(x):
    return x * SCALE
"""
RUN = """
import sys
sys.path.insert(0, {root!r})
if {guard}:
    from estimators.kernel_cache import drop_stale
    drop_stale(__import__("pathlib").Path({root!r}), {cache!r}, ("estimators",))
from estimators.kernel import scaled
print(scaled(2))
"""


def _tree(tmp_path: Path, scale: int) -> Path:
    root = tmp_path / "src"
    pkg = root / "estimators"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "kernel_cache.py").write_text(Path(sys.modules[drop_stale.__module__].__file__).read_text())
    (pkg / "limits.py").write_text(f"SCALE = {scale}\n")
    (pkg / "kernel.py").write_text(textwrap.dedent(KERNEL))
    return root


def _run(root: Path, cache: Path, guard: bool) -> str:
    code = RUN.format(root=str(root), cache=str(cache), guard=guard)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_numba_alone_keeps_a_changed_constant_of_another_module(tmp_path) -> None:
    root, cache = _tree(tmp_path, 3), tmp_path / "cache"
    assert _run(root, cache, guard=False) == "6"
    (root / "estimators" / "limits.py").write_text("SCALE = 5\n")
    assert _run(root, cache, guard=False) == "6"  # stale: what the mend below exists for


def test_a_changed_import_drops_the_kernels_compiled_from_it(tmp_path) -> None:
    root, cache = _tree(tmp_path, 3), tmp_path / "cache"
    assert _run(root, cache, guard=True) == "6"
    cached = sorted(p.name for p in cache.rglob("kernel.*"))
    assert any(n.endswith(".nbi") for n in cached)
    assert _run(root, cache, guard=True) == "6"
    assert sorted(p.name for p in cache.rglob("kernel.*")) == cached  # unchanged code: the cache is kept
    (root / "estimators" / "limits.py").write_text("SCALE = 5\n")
    assert _run(root, cache, guard=True) == "10"


def test_only_modules_that_import_the_change_are_dropped(tmp_path) -> None:
    root, cache = _tree(tmp_path, 3), tmp_path / "cache"
    other = root / "estimators" / "other.py"
    other.write_text("from numba import njit\n\n\n@njit(cache=True)\ndef one():\n    return 1\n")
    closures = source_closures(root, ("estimators",))
    assert sorted(Path(f).name for f in closures) == ["kernel.py", "other.py"]  # modules that compile kernels
    drop_stale(root, str(cache), ("estimators",))
    sub = next(cache.iterdir())
    for stem in ("kernel", "other"):
        (sub / f"{stem}.scaled-1.py311.nbi").write_text("x")
        assert (sub / f"{stem}{DEPS_SUFFIX}").is_file()
    (root / "estimators" / "limits.py").write_text("SCALE = 5\n")
    removed = drop_stale(root, str(cache), ("estimators",))
    assert [p.name for p in removed] == ["kernel.scaled-1.py311.nbi"]
    assert (sub / "other.scaled-1.py311.nbi").is_file()
