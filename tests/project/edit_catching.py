"""Does the default test suite catch deliberate edits? A table of them, each run against the suite.

Why: the default suite (the README's ``python -m pytest -q`` in the repository root) is what guards the
scheduler kernels and the checks that refuse bad input. When the suite is made faster (tests merged,
sizes cut, fixtures shared), this table shows it still catches what it caught before: run it at both
versions and compare the result columns. Each edit is a small, real change of behaviour that a correct
suite should notice: ``kernel`` edits change a Numba scheduling, engine, timing, block-pool, twin or SFS
function; ``refusal`` edits weaken a function that refuses bad input (an input, meta or output check, a
command-line range check, a recording's consistency check, an importer's column check).

How to run it (from the repository root, in the environment the suite runs in)::

    python tests/project/edit_catching.py --list                  # every edit and whether it applies (no pytest)
    python tests/project/edit_catching.py                         # the whole table (each run up to --cap seconds)
    python tests/project/edit_catching.py --only preempt_to_back,intin_no_upper --cap 180 --json out.json

For each edit the tracked files of ``--repo``, as they are in its working tree (uncommitted changes
included), are copied to a scratch directory, the edit is applied there and the default suite runs
there: ``python -m pytest -q -x -p no:cacheprovider`` (the pyproject's addopts apply) with the copy on
PYTHONPATH (so the command-line processes tests start import the copy too), a fresh pool-baseline cache,
LATROUTE_SHARED_DATA set to ``--repo``'s ``../shared/data`` when it exists and the environment's is
unset, and a wall-clock cap after which the run's whole process group is killed. Results: ``caught``
(pytest failed; the first failing test is named), ``missed`` (the whole suite passed) or ``timeout``.
The unedited copy runs first, to its end (``--warm-cap``): the control, which also fills the warm
Numba cache below. If it does not pass, the table is void.

Numba's cache: the kernels are ``@njit(cache=True)``, and Numba keys a function's cache entry by its
own file's content only, not by its callees in other files (which it compiles in, inlined or linked),
so a warm cache would hide an edit to a callee. So the script first runs the unedited suite once (cap
``--warm-cap``) with NUMBA_CACHE_DIR pointing at a warm cache, and gives every later run a fresh copy of
it, from which, for an edit of a compiled function, it deletes the entries (``*.nbi``, ``*.nbc``) of the
edited module and of every module that imports it, directly or transitively (the import statements of every .py file of the copy,
read with ``ast``, lazy imports in functions included). Numba names the directory of a file's entries
``<parent directory name>_<sha1 of the file's absolute directory>`` directly under NUMBA_CACHE_DIR,
and each entry ``<file stem>.<qualname>-<line>.py<version>.nbi`` (or ``.<n>.nbc``); the copy always
lives at the same path, so the entries made by the warm-up apply to every later copy. If an entry of
the warm cache cannot be mapped to a file of the copy this way, every run gets a cold (empty) cache
instead, and the output says so.

An edit names the function it changes (``name`` or ``Class.method``; ``module``, a dotted suffix such
as ``engine.primitives``, when the name is not unique), and an ``old`` snippet that must occur exactly
once in that function's source, replaced by ``new``. Functions are found by parsing every .py file
under harness/, traces/, estimators/, routers/ and reports/, so an edit follows its function to
another file. This module is one piece: the edit list and the machinery that applies and runs it are
read and changed together.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

PACKAGES = ("harness", "traces", "estimators", "routers", "reports")
PYTEST = ["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
DEFAULT_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Edit:
    name: str
    function: str  # "name" or "Class.method"
    kind: str  # kernel | refusal
    breaks: str  # one line: the behaviour the edit breaks
    old: str
    new: str
    module: str | None = None  # dotted suffix of the module, when the function's name is not unique


K, R = "kernel", "refusal"
EDITS = [
    # --- kernels
    Edit("preempt_to_back", "preempt", K,
         "a preempted request goes to the back of the waiting queue instead of the front",
         "wait_push_front(sc, st.waiting, s)", "wait_push_back(sc, st.waiting, s)"),
    Edit("priority_ties_by_id", "runs_before", K,
         "under priority scheduling, waiting requests of equal priority are ordered by request id, not arrival",
         "if req[a, F_ARRIVAL] != req[b, F_ARRIVAL]:", "if False:"),
    Edit("priority_victim_last_of_equals", "_victim", K,
         "under priority scheduling, the victim among equal (priority, arrival) is the last in running, not the first",
         "and req[x, F_ARRIVAL] > req[v, F_ARRIVAL]", "and req[x, F_ARRIVAL] >= req[v, F_ARRIVAL]"),
    Edit("cdiv_floor", "cdiv", K,
         "ceiling division rounds down: a partly filled KV block is not counted",
         "return -(-a // b)", "return a // b"),
    Edit("v1_budget_minus_one", "_schedule_v1", K,
         "vLLM V1's step token budget is one token short of max_num_batched_tokens",
         "budget = cfg[C_BUDGET]", "budget = cfg[C_BUDGET] - 1"),
    Edit("v1_max_seqs_plus_one", "_schedule_v1", K,
         "vLLM V1 admits a request when running already holds max_num_seqs",
         "if sc[S_NR] >= cfg[C_MAX_SEQS]:", "if sc[S_NR] > cfg[C_MAX_SEQS]:"),
    Edit("lru_free_head_first", "free_request", K,
         "freed cached blocks join the free queue head first, not tail first (the prefix cache's LRU order)",
         "for i in range(held - 1, -1, -1):", "for i in range(held):"),
    Edit("prefix_hit_whole_prompt", "find_hit", K,
         "a prefix-cache hit may cover the whole prompt (vLLM caps it at num_tokens - 1)",
         "cap = (num_tokens - 1) // block_size", "cap = num_tokens // block_size"),
    Edit("rng_uniform_half", "rng_uniform", K,
         "the noise stream's uniform draws cover [0, 0.5) instead of [0, 1)",
         "rng_next(s) >> np.uint64(11)", "rng_next(s) >> np.uint64(12)"),
    Edit("batch_attention_sum", "batch_typical_time", K,
         "a prefill chunk's attention feature sums t(t-1)/2 instead of t(t+1)/2",
         "t * (t + 1.0) / 2.0", "t * (t - 1.0) / 2.0"),
    Edit("sync_one_token_more", "_complete_sync", K,
         "a request finishes one output token after its target length",
         "if req[s, F_OUTPUTS] >= req[s, F_TARGET]:", "if req[s, F_OUTPUTS] > req[s, F_TARGET]:"),
    Edit("async_stale_placeholder", "_complete_async", K,
         "async scheduling returns a placeholder for stale outputs and keeps it for fresh ones",
         "if not stale:", "if stale:"),
    Edit("async_no_cache_on_finish", "_complete_async", K,
         "async scheduling: the finishing output does not register the request's blocks before they are freed",
         "if status == ST_RUNNING and cfg[C_PREFIX] != PREFIX_OFF:",
         "if status == ST_RUNNING and cfg[C_PREFIX] != PREFIX_OFF and not req[s, F_EVENT] & EV_FINISH:"),
    Edit("async_cache_placeholders", "_complete_async", K,
         "async scheduling: an output registers the request's blocks including the placeholder tokens in flight",
         "done = req[s, F_COMPUTED] - req[s, F_PH]", "done = req[s, F_COMPUTED]"),
    Edit("twin_no_step_gap", "advance", K,
         "the twin's event loop starts the next schedule() at the step's end, without the inter-step gap",
         "times[T_START] = t_end + model.gap", "times[T_START] = t_end", module="twin.kernel"),
    Edit("sfs_ignores_elapsed", "sfs_estimate", K,
         "SFS charges the in-flight step its whole expected time, ignoring the time already elapsed",
         "rem = typ0 * model.mult - elapsed", "rem = typ0 * model.mult"),
    # --- refusals
    Edit("replay_unsorted_arrivals", "check_replay_arrivals", R,
         "replay accepts arrivals that go back in time by less than 1e9 s",
         "np.diff(times) < 0", "np.diff(times) < -1e9"),
    Edit("frame_nan_accepted", "validate_frame", R,
         "a NaN in a non-nullable numeric column is accepted",
         "bad = first_true(np.isnan(values))", "bad = None"),
    Edit("frame_negative_accepted", "validate_frame", R,
         "a negative value in a non-negative column (times, token counts) is accepted",
         "bad = first_true(values <= 0 if col.positive else values < 0)",
         "bad = first_true(values <= 0) if col.positive else None"),
    Edit("frame_unsorted_accepted", "validate_frame", R,
         "a table's sorted column (requests' arrival_s, ...) may go back within a chunk",
         "bad = first_true(np.diff(v) < 0)", "bad = None"),
    Edit("cached_above_prompt", "check_request_cells", R,
         "a request's cached_tokens may exceed its prompt_tokens",
         "bad = first_true(cached > prompt)", "bad = None"),
    Edit("meta_negative_overhead", "check_meta", R,
         "meta.json's frontend_overhead_s may be negative",
         "not 0 <= fo <= MAX_TIME_S", "not -MAX_TIME_S <= fo <= MAX_TIME_S"),
    Edit("out_parent_of_cwd", "check_out", R,
         "an output may be a parent of the working directory (only the directory itself is refused)",
         "if _inside(cwd, real):", "if cwd == real:"),
    Edit("out_overlaps_input", "check_out", R,
         "an output may lie inside an input or contain it (only the input itself is refused)",
         "if _inside(real, rin) or _inside(rin, real):", "if real == rin:"),
    Edit("finite_accepts_nan", "Finite.check", R,
         "a float option accepts nan",
         "if math.isnan(x) or (math.isinf(x)", "if (math.isinf(x)"),
    Edit("intin_no_upper", "IntIn.check", R,
         "an integer option accepts values above its maximum",
         "return n if self.lo <= n <= self.hi else None", "return n if self.lo <= n else None"),
    Edit("recording_duplicate_items", "check_recording", R,
         "a recording may schedule one request twice in one step",
         '_check_duplicate_items(it_k, it_r, it_step, it_rid, where["step_items"])', "None"),
    Edit("recording_step_before_arrival", "_check_against_requests", R,
         "a recording's step may schedule a request before it arrived",
         "bad = first_true(start < arrival[it_r] - STEP_TIME_SLACK_S)", "bad = None"),
    Edit("steps_end_before_start", "check_steps", R,
         "a step may end before it starts",
         "bad = first_true(end < start - STEP_TIME_SLACK_S)", "bad = None"),
    Edit("import_first_column_optional", "require_columns", R,
         "an importer accepts a file without the first column it needs",
         "for name in needed:", "for name in needed[1:]:"),
]


# ----------------------------------------------------------------- finding and applying an edit
class EditError(Exception):
    pass


@dataclass(frozen=True)
class Found:
    path: Path  # relative to the repository
    module: str
    qualname: str
    first: int  # 1-based line of the def
    last: int
    compiled: bool = False  # decorated for Numba (njit, jit, overload, ...): its code is inside its callers' entries


NUMBA_DECORATORS = {"njit", "jit", "overload", "overload_method", "register_jitable", "generated_jit", "vectorize",
                    "guvectorize", "intrinsic", "cfunc"}


def _numba_decorator(d: ast.expr) -> bool:
    """``@njit``, ``@njit(...)``, ``@numba.njit(...)``, ``@overload(f, ...)`` and the like."""
    f = d.func if isinstance(d, ast.Call) else d
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name in NUMBA_DECORATORS


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def functions(repo: Path) -> list[Found]:
    """Every function and method (nested ones too) of the packages, with its qualified name."""
    out: list[Found] = []
    for top in PACKAGES:
        for path in sorted((repo / top).rglob("*.py")):
            rel = path.relative_to(repo)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(rel))

            def walk(node: ast.AST, prefix: str, rel: Path = rel) -> None:
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                        q = prefix + child.name
                        out.append(Found(rel, module_name(rel), q, child.lineno, child.end_lineno,
                                         any(_numba_decorator(d) for d in child.decorator_list)))
                        walk(child, q + ".")
                    elif isinstance(child, ast.ClassDef):
                        walk(child, prefix + child.name + ".")
                    else:
                        walk(child, prefix)

            walk(tree, "")
    return out


def _suffix(dotted: str, want: str) -> bool:
    return dotted == want or dotted.endswith("." + want)


def locate(edit: Edit, index: list[Found]) -> Found:
    hits = [f for f in index if _suffix(f.qualname, edit.function)]
    if edit.module:
        hits = [f for f in hits if _suffix(f.module, edit.module)]
    where = f" in a module ending {edit.module!r}" if edit.module else ""
    if not hits:
        raise EditError(f"{edit.name}: no function {edit.function!r}{where} under {', '.join(PACKAGES)}")
    if len(hits) > 1:
        places = ", ".join(f"{f.module}.{f.qualname} ({f.path}:{f.first})" for f in hits)
        raise EditError(f"{edit.name}: {edit.function!r}{where} is defined {len(hits)} times ({places}): "
                        "give a module (a dotted suffix) that names one")
    return hits[0]


def edited_text(edit: Edit, repo: Path, found: Found) -> str:
    """The edited file's new text; EditError unless ``old`` occurs exactly once in the function."""
    text = (repo / found.path).read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    start = sum(len(x) for x in lines[:found.first - 1])
    end = start + sum(len(x) for x in lines[found.first - 1:found.last])
    body = text[start:end]
    n = body.count(edit.old)
    if n != 1:
        raise EditError(f"{edit.name}: the snippet {edit.old!r} occurs {n} times in {found.qualname} "
                        f"({found.path}:{found.first}-{found.last}), not once")
    if edit.new == edit.old:
        raise EditError(f"{edit.name}: old and new are the same")
    new = text[:start] + body.replace(edit.old, edit.new) + text[end:]
    try:
        ast.parse(new)
    except SyntaxError as e:
        raise EditError(f"{edit.name}: the edited {found.path} does not parse: {e}") from None
    return new


# ----------------------------------------------------------------- copies and Numba's cache
def tracked_files(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def copy_repo(repo: Path, files: list[str], dest: Path) -> None:
    """The tracked files as they are in ``repo``'s working tree (deleted ones skipped), into ``dest``."""
    if dest.exists():
        shutil.rmtree(dest)
    for rel in files:
        src = repo / rel
        if not os.path.lexists(src):
            continue
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the copy outside hidden directories."""
    out = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
            continue
        out[module_name(rel)] = path
    return out


def _imported(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """The names a module's import statements import, dotted (relative ones resolved; ``from a import b``
    gives a.b, which ``dependents`` takes as the module a.b if there is one, else as the module a)."""
    pkg = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                up = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
                base = ".".join(up + ([base] if base else []))
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def dependents(root: Path, edited: str) -> set[str]:
    """``edited`` and every module of the copy that imports it, directly or through others."""
    mods = module_files(root)
    users: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for target in _imported(tree, m, path.name == "__init__.py"):
            while target and target not in mods:  # "from a.b import c" where c is a name: the module a.b
                target = target.rpartition(".")[0]
            if target and target != m:
                users[target].add(m)
    seen, todo = {edited}, [edited]
    while todo:
        for u in users.get(todo.pop(), ()):
            if u not in seen:
                seen.add(u)
                todo.append(u)
    return seen


def cache_dir_name(py_file: Path) -> str:
    """Numba's directory under NUMBA_CACHE_DIR for a file's entries (``_CacheLocator.get_suitable_cache_subpath``)."""
    d = os.path.dirname(os.path.abspath(py_file))
    return f"{os.path.split(d)[-1]}_{hashlib.sha1(d.encode()).hexdigest()}"


def cache_owners(cache: Path, root: Path) -> tuple[dict[Path, str], list[Path]]:
    """Each cache entry -> the module it belongs to, and the entries that map to no file of the copy."""
    by_dir: dict[str, list[tuple[str, str]]] = {}
    for m, path in module_files(root).items():
        by_dir.setdefault(cache_dir_name(path), []).append((path.stem + ".", m))
    owners, unknown = {}, []
    for f in sorted(cache.rglob("*")):
        if f.suffix not in (".nbi", ".nbc"):
            continue
        rel = f.relative_to(cache)
        hits = [m for stem, m in by_dir.get(rel.parts[0], []) if len(rel.parts) == 2 and f.name.startswith(stem)]
        if len(hits) == 1:
            owners[f] = hits[0]
        else:
            unknown.append(f)
    return owners, unknown


# ----------------------------------------------------------------- running the suite
def kill_group(proc: subprocess.Popen) -> int:
    """Stop the run's whole process group (SIGTERM, then SIGKILL after 10 s); its exit status."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue
    return proc.wait()


def run_suite(root: Path, cache: Path, cap: float, log: Path, shared: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("LATROUTE_CACHE_DIR", "PYTEST_ADDOPTS")}
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["NUMBA_CACHE_DIR"] = str(cache)
    if shared is not None and "LATROUTE_SHARED_DATA" not in env:
        env["LATROUTE_SHARED_DATA"] = str(shared)
    t0 = time.monotonic()
    failed_at = None
    with open(log, "wb") as out:
        # its own process group, to kill at the cap; Ctrl-C at its default (a shell's background job starts
        # with SIGINT ignored, which Python then keeps: the suite's own Ctrl-C tests would fail)
        proc = subprocess.Popen([sys.executable, *PYTEST], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, process_group=0,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        timed_out = False
        try:
            # the edit is caught when the suite reports a failure (an F or E in its progress), not when
            # pytest exits: with -x, pytest-xdist stops the other worker only after its running test ends,
            # and its shutdown after a failure can hang; a run that reported one gets GRACE_S to print its
            # summary (which names the test), then is stopped
            rc = None
            while rc is None:
                now = time.monotonic() - t0
                if failed_at is None and now < cap and reported_failure(log):
                    failed_at = now
                deadline = cap if failed_at is None else min(cap, failed_at + GRACE_S)
                if now >= deadline:
                    break
                try:
                    rc = proc.wait(timeout=min(POLL_S, deadline - now))
                except subprocess.TimeoutExpired:
                    pass
            if rc is None:
                timed_out = failed_at is None
                rc = kill_group(proc)
            elif failed_at is None and rc != 0:
                failed_at = time.monotonic() - t0
        except BaseException:  # interrupted or terminated: leave no suite running
            kill_group(proc)
            raise
    seconds = round(time.monotonic() - t0 if failed_at is None else failed_at, 1)
    text = log.read_text(encoding="utf-8", errors="replace")
    first = None
    m = re.search(r"^(?:FAILED|ERROR) (\S+)", text, re.M)
    if m:
        first = m.group(1)
    if timed_out:
        result = "timeout"
    elif failed_at is None and rc == 0:
        result = "missed"
    else:
        result = "caught"
        if first is None and failed_at is not None and rc < 0:
            first = f"(not named: stopped {GRACE_S:g} s after the failure, before pytest's summary)"
        elif first is None:
            tail = [x for x in text.strip().splitlines() if x.strip()][-1:] or [""]
            first = f"(exit {rc}: {tail[0][:100]})"
    return {"result": result, "seconds": seconds, "exit": rc, "first_failure": first if result == "caught" else None}


POLL_S = 0.5
GRACE_S = 30.0
_PROGRESS = re.compile(r"^[.sxXFE]+(?: +\[ *\d+%\])?$")


def reported_failure(log: Path) -> bool:
    """Whether pytest's -q progress in ``log`` shows a failed or erroring test yet."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(("F" in ln or "E" in ln) and _PROGRESS.match(ln.strip()) for ln in text.splitlines())


def prepare_cache(warm: Path, dest: Path, owners: dict[Path, str] | None, drop: set[str]) -> int:
    """A fresh cache at ``dest``: the warm one without the entries of the modules ``drop`` (an empty one
    when ``owners`` is None). Returns the entries deleted."""
    if dest.exists():
        shutil.rmtree(dest)
    if owners is None:
        dest.mkdir(parents=True)
        return 0
    shutil.copytree(warm, dest)
    gone = 0
    for f, m in owners.items():
        if m in drop:
            (dest / f.relative_to(warm)).unlink(missing_ok=True)
            gone += 1
    return gone


# ----------------------------------------------------------------- the command
def select(only: str | None) -> list[Edit]:
    if not only:
        return list(EDITS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {e.name: e for e in EDITS}
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit(f"unknown edit(s): {', '.join(unknown)} (known: {', '.join(known)})")
    return [known[n] for n in names]


def check_all(edits: list[Edit], repo: Path) -> list[tuple[Edit, Found | None, str | None]]:
    index = functions(repo)
    out = []
    for e in edits:
        try:
            f = locate(e, index)
            edited_text(e, repo, f)
            out.append((e, f, None))
        except EditError as err:
            out.append((e, None, str(err)))
    return out


def md(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--repo", type=Path, default=DEFAULT_REPO, help="the repository (default: the one this sits in)")
    p.add_argument("--cap", type=float, default=180.0, help="wall-clock cap of each run, seconds (default 180)")
    p.add_argument("--warm-cap", type=float, default=3600.0,
                   help="cap of the unedited run that fills the warm Numba cache, seconds (default 3600)")
    p.add_argument("--only", help="comma-separated edit names")
    p.add_argument("--list", action="store_true", help="list the edits and check they apply; run nothing")
    p.add_argument("--json", type=Path, help="also write the results as JSON here")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory (copies, caches, logs)")
    p.add_argument("--reuse", type=Path, metavar="DIR",
                   help="a scratch directory kept from an earlier run of the same code whose warm-up (the control) "
                        "passed: its warm cache and control are reused, the warm-up is not run again")
    a = p.parse_args(argv)
    repo = a.repo.resolve()
    edits = select(a.only)
    checked = check_all(edits, repo)
    bad = [err for _, _, err in checked if err]
    if a.list:
        print("| edit | kind | function | where | what it breaks |\n|---|---|---|---|---|")
        for e, f, err in checked:
            where = f"{f.path}:{f.first} ({f.module}.{f.qualname})" if f else f"**does not apply**: {err}"
            print(f"| {e.name} | {e.kind} | {md(e.function)} | {md(where)} | {md(e.breaks)} |")
        kinds = {k: sum(e.kind == k for e in edits) for k in (K, R)}
        print(f"\n{len(edits) - len(bad)} of {len(edits)} edits apply ({kinds[K]} kernel, {kinds[R]} refusal)")
        return 1 if bad else 0
    if bad:
        print("\n".join(bad), file=sys.stderr)
        return 2
    shared = repo.parent / "shared" / "data"
    shared = shared if shared.is_dir() else None
    files = tracked_files(repo)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "-uno"], capture_output=True,
                                text=True).stdout.strip())
    work = Path(os.path.realpath(a.reuse if a.reuse else tempfile.mkdtemp(prefix="edit-catching-")))
    root, warm, cache, logs = work / "repo", work / "warm-cache", work / "cache", work / "logs"
    logs.mkdir(exist_ok=True)
    report: dict = {"repo": str(repo), "head": head, "uncommitted_changes": dirty, "cap_s": a.cap,
                    "command": "python " + " ".join(PYTEST), "edits": []}
    def say(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    def terminated(signum, frame):
        raise SystemExit(f"terminated (signal {signum})")

    signal.signal(signal.SIGTERM, terminated)  # so the run in progress is stopped and the scratch removed

    try:
        if a.reuse:  # the same path as before: the warm entries' directory names hash the copy's path
            summary = (logs / "warmup.log").read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1]
            m = re.search(r"(\d+) passed.* in ([\d.]+)s", summary)
            if not warm.is_dir() or not m or re.search(r"failed|error", summary):
                raise SystemExit(f"--reuse {work}: no warm cache or no passing warm-up log there ({summary!r})")
            report["warmup"] = {"result": "missed", "seconds": float(m.group(2)), "exit": 0, "first_failure": None,
                                "reused": str(work)}
            say(f"warm-up: reused from {work} ({summary})")
        else:
            say(f"warm-up: the unedited suite with an empty Numba cache (cap {a.warm_cap:g} s) in {work}")
            copy_repo(repo, files, root)
            warm.mkdir()
            report["warmup"] = run_suite(root, warm, a.warm_cap, logs / "warmup.log", shared)
        owners, unknown = cache_owners(warm, root)
        if unknown:
            report["numba_cache"] = (f"cold: {len(unknown)} warm-cache entries map to no file of the copy "
                                     f"(e.g. {unknown[0].relative_to(warm)})")
            owners = None
        elif not owners:
            report["numba_cache"] = "cold: the warm-up left no entries"
            owners = None
        else:
            report["numba_cache"] = f"warm: {len(owners)} entries, each run drops the edited module's and its importers'"
        say(f"warm-up: {report['warmup']['result']} in {report['warmup']['seconds']} s; Numba cache {report['numba_cache']}")
        # the warm-up is the control: the unedited suite, run to its end (a capped rerun would time out
        # wherever the whole suite takes longer than --cap, which is what the edits' cap bounds)
        report["control"] = report["warmup"]
        for e, f, _ in checked:
            copy_repo(repo, files, root)
            (root / f.path).write_text(edited_text(e, repo, f), encoding="utf-8")
            # only a compiled function's code is copied into other entries (its callers'); a Python function's
            # edit leaves every cache entry valid, and dropping them would only add compiles to the run
            gone = prepare_cache(warm, cache, owners, dependents(root, f.module) if f.compiled else set())
            r = run_suite(root, cache, a.cap, logs / f"{e.name}.log", shared)
            r.update(name=e.name, function=e.function, kind=e.kind, breaks=e.breaks, file=str(f.path),
                     cache_entries_dropped=gone)
            report["edits"].append(r)
            say(f"{e.name}: {r['result']} in {r['seconds']} s {r['first_failure'] or ''}")
    finally:
        if a.keep or a.reuse:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    c = report["control"]
    report["void"] = c["result"] != "missed"
    print(f"Default suite (`{report['command']}`) at {head[:12]}{' + uncommitted changes' if dirty else ''}, "
          f"cap {a.cap:g} s; Numba cache {report['numba_cache']}.\n")
    if report["void"]:
        print(f"**The control (the unedited suite) did not pass ({c['result']} after {c['seconds']} s"
              f"{', first failure ' + c['first_failure'] if c['first_failure'] else ''}): this table is void"
              f"{' (raise --warm-cap above the suite' + chr(39) + 's time)' if c['result'] == 'timeout' else ''}.**\n")
    else:
        print(f"Control (the unedited suite): passed in {c['seconds']} s.\n")
    print("| edit | function | kind | what it breaks | result | seconds | first failing test |")
    print("|---|---|---|---|---|---|---|")
    for r in report["edits"]:
        print(f"| {r['name']} | {md(r['function'])} | {r['kind']} | {md(r['breaks'])} | {r['result']} | "
              f"{r['seconds']:.1f} | {md(r['first_failure'] or '')} |")
    counts = {k: sum(r["result"] == k for r in report["edits"]) for k in ("caught", "missed", "timeout")}
    print(f"\n{counts['caught']} caught, {counts['missed']} missed, {counts['timeout']} timed out "
          f"of {len(report['edits'])}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
