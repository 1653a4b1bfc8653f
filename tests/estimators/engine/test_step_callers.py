"""Who steps an instance: every call of the scheduler kernel's step API
(``estimators.engine.kernel``'s ``schedule_step`` and ``complete_step``)
outside the tests, by the function it is in.

Why: vLLM's rules are written once (``estimators.engine``), and so should
the loop that steps an instance through them be: every loop that calls
them again is a copy that an engine behaviour still to come would have to
be written into. The twin's loop (sync and async scheduling, the oracle's
fork and ``serve`` alike) reaches them only through ``advance``; SFS's
point estimate still has its own loop, one per scheduling mode, and the
recorded walk and the decision check apply recorded steps or trial one
schedule(). A new caller fails here until it is listed, with its reason.
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
    # the twin's loop: schedule() (with its refusals) and the outputs, reached only through ``advance``
    ("harness/twin/loop/parts.py", "schedule_or_reject"): {"schedule_step"},
    ("harness/twin/loop/kernel.py", "_complete"): {"complete_step"},
    # SFS's point estimate: its synchronous and its async loop (expected step times, stops at the query's
    # first token; not yet the twin's loop)
    ("estimators/sfs/kernel.py", "sfs_estimate"): {"schedule_step", "complete_step"},
    ("estimators/sfs/async_kernel.py", "sfs_estimate_async"): {"schedule_step", "complete_step"},
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


def test_the_twin_reaches_the_step_api_only_through_advance():
    """One loop for both scheduling modes: ``schedule_or_reject`` is called
    by ``_plan`` alone, ``_plan`` and ``_complete`` by ``advance`` alone,
    and nothing outside the loop's module calls them."""
    for callee, caller in (("schedule_or_reject", "_plan"), ("_plan", "advance"), ("_complete", "advance")):
        assert set(_callers_of({callee})) == {("harness/twin/loop/kernel.py", caller)}, callee
