"""Who steps an instance: every call of the scheduler kernel's step API
(``estimators.engine.kernel``'s ``schedule_step`` and ``complete_step``)
outside the tests, by the function it is in.

Why: vLLM's rules are written once (``estimators.engine``), and so should
the loop that steps an instance through them be: every loop that calls
them again is a copy that an engine behaviour still to come would have to
be written into. One function calls them, the engine loop's ``loop_step``
(``estimators.engine.step_loop``); the twin (sync and async scheduling,
the oracle's fork and ``serve`` alike, through ``advance``) and SFS (its
point estimate in either mode, which the bound and the distribution read)
step through it. The recorded walk and the decision check apply recorded
steps or trial one schedule(). A new caller fails here until it is
listed, with its reason.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
STEP_API = {"schedule_step", "complete_step"}
PACKAGES = ("estimators", "harness", "routers", "traces")  # the code; the tests call the kernel on purpose

# (file, function) -> the step-API calls in it
CALLERS = {
    # the engine loop's one event: schedule() (with its refusals) or the outputs; the twin (``advance``, both
    # scheduling modes) and SFS (both modes) step an instance only through it
    ("estimators/engine/step_loop.py", "loop_step"): {"schedule_step", "complete_step"},
    # not loops of the scheduler: a recorded step's outputs, and one trial schedule() on a copy
    ("estimators/snapshot.py", "complete_revealing"): {"complete_step"},
    ("estimators/snapshot.py", "drop_unservable"): {"schedule_step"},
    ("harness/twin/fidelity/decisions.py", "decision_agreement"): {"schedule_step"},
}


def _calls(fn: ast.AST, names: set[str]) -> list[str]:
    """The calls of ``names`` in ``fn``'s own body (not in functions nested in it)."""
    found = []
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                name = None  # a method of the caller's own class, not a module's function
            else:
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in names:
                found.append(name)
        stack.extend(ast.iter_child_nodes(node))
    return found


@functools.cache
def _functions() -> tuple[tuple[str, ast.AST], ...]:
    """Every function of the code, by file (parsed once per session)."""
    return tuple(_walk())


def _walk():
    for path in sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")):
        rel = path.relative_to(ROOT)
        tree = ast.parse(path.read_text(), filename=str(rel))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield rel.as_posix(), node


def _callers_of(names: set[str]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rel, fn in _functions():
        hit = _calls(fn, names)
        if hit:
            out.setdefault((rel, fn.name), set()).update(hit)
    return out


def test_step_api_callers_are_the_listed_ones():
    assert _callers_of(STEP_API) == CALLERS


def test_every_loop_steps_through_the_one_step():
    """The twin's loop and SFS's call the engine loop's ``loop_step`` and nothing
    else of the step API; nothing else calls ``loop_step``."""
    assert set(_callers_of({"loop_step"})) == {
        ("harness/twin/loop/kernel.py", "advance"),  # both scheduling modes, the fork and serve through it
        ("estimators/sfs/kernel.py", "sfs_estimate"),  # the in-flight step's outputs
        ("estimators/sfs/kernel.py", "_until_first_token"),  # SFS's steps, sync and async
    }
